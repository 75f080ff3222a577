"""The model-free baselines the benchmark compares ToolSpec with (measuring code, not product):
SAM-Decoding (``samd``) and Token Recycling (``recycling``). Prompt lookup and SuffixDecoding
live in ``toolspec.drafting`` — ToolSpec drafts with them too. See docs/baselines.md."""
