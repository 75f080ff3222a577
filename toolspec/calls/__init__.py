"""What a tool call is and how a model writes it: tool sets (``tools``), the call formats and
their one incremental scanner (``formats``), the one parse of a request's output (``output``),
chat prompts (``prompts``) and the llguidance grammars that constrain a call (``tool_grammar``).
Imports nothing else of toolspec."""
