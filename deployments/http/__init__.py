"""The ingress process: the OpenAI-compatible HTTP API in front of the model replicas.

``ingress`` is the Serve deployment (the FastAPI app of ``api`` over a handle to the replicas);
a request is read and checked (``limits``, ``schemas``, ``admission``, ``auth``, ``tenants``,
``prompting``) and served by its endpoint's part — ``chat`` (chat completions) or
``responses`` (the Responses API: protocol, events, serving; its stored responses in
``deployments.stored_responses``): admitted into a ``deployments.messages.ChatRequest``, sent
to a replica through a ``model_client.ModelClient``, its events read once (``answer``) and
written by the endpoint's reply (``tool_stream`` splits the output into content and calls).
``health`` answers ``GET /health``. Never imports the replica side: the two meet only in
``deployments.messages``.
"""
