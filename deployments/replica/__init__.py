"""A model replica's process: one loaded engine serving many requests at once.

``model_replica.ModelReplica`` runs requests on the engine behind the ``chat_engine.ChatEngine``
seam: vLLM with the ToolSpec proposer (``vllm_engine``) or the project's own engine
(``chat_engine.ToolSpecChatEngine`` with its ``scheduler`` and ``tensor_parallel_group``); both
plan a request the same way (``request_plan``). Never imports the HTTP side: requests arrive as
``deployments.messages.ChatRequest`` and leave as its events.
"""
