"""The ingress process: the OpenAI-compatible HTTP API in front of the model replicas.

``ingress`` is the Serve deployment (the FastAPI app of ``api`` over a handle to the replicas);
a request is read and checked (``limits``, ``schemas``, ``admission``, ``auth``, ``tenants``,
``prompting``), sent to a replica as a ``deployments.messages.ChatRequest`` through a
``model_client.ModelClient``, and its events written back as chat completions
(``chat_bodies``, ``tool_stream``) or as the Responses API (``responses_api``, its stored
responses in ``deployments.stored_responses``); ``health`` answers ``GET /health``.
Never imports the replica side: the two meet only in ``deployments.messages``.
"""
