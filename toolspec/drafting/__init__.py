"""Draft sources, each a ``toolspec.core.drafter.Drafter``: the schema-aware call drafter
(``schema``, ``tool_calls``, ``call_grammar`` and its value candidates), drafts retrieved from the
call library (``retrieval``), prompt lookup and suffix decoding. Imports core, calls and the
library; never the model or anything that measures."""
