"""ToolSpec: training-free, lossless speculative decoding for LLM tool calls.

The engine's names are imported on first use, so processes that only need a light part (the call
library in a retrieval actor, the formats in an HTTP ingress) do not pay for torch.
"""

from __future__ import annotations

import importlib
from typing import Any

_EXPORTS = {
    "DraftTree": "toolspec.draft_tree",
    "Engine": "toolspec.engine",
    "Generation": "toolspec.engine",
    "GenerationParams": "toolspec.engine",
    "SamplingParams": "toolspec.sampling",
    "StepEvent": "toolspec.engine",
    "StepStats": "toolspec.engine",
    "TargetModel": "toolspec.target_model",
}

__all__ = sorted(_EXPORTS)


def __getattr__(name: str) -> Any:
    if name not in _EXPORTS:
        raise AttributeError(f"module 'toolspec' has no attribute {name!r}")
    return getattr(importlib.import_module(_EXPORTS[name]), name)
