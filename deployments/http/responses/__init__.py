"""``/v1/responses``: the protocol (``protocol``: a Responses request read and turned into
the chat request it means, the ``response`` object), the stream's events (``events``), and
how a request is admitted and its answer written and kept (``serving``; the store itself is
``deployments.stored_responses``)."""
