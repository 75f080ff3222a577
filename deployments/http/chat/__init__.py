"""``POST /v1/chat/completions``: its bodies and chunks (``bodies``) and how a request is
admitted and its answer written (``serving``)."""
