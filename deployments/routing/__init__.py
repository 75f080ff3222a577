"""Which model replica a request goes to: ``prefix_router``, Ray Serve's request-router API
picking the replica whose prefix cache holds the most of the prompt (it runs where the
handle is called: in the ingress process)."""
