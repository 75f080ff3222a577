"""A model replica's process: one loaded engine serving many requests at once.

``model_replica.ModelReplica`` runs requests on the engine behind the ``engine.ChatEngine``
seam (``engine.EngineSettings``: what a replica loads): vLLM with the ToolSpec proposer
(``vllm_engine``) or the project's own engine (``toolspec_engine.ToolSpecChatEngine`` with its
``scheduler`` and ``tensor_parallel_group``); both plan a request the same way
(``request_plan``). Never imports the HTTP side: requests arrive as
``deployments.messages.ChatRequest`` and leave as its events.
"""
