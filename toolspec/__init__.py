"""ToolSpec: training-free, lossless speculative decoding for LLM tool calls.

The engine's names are imported on first use, so processes that only need a light part (the call
library in a retrieval actor, the formats in an HTTP ingress) do not pay for torch.
"""

from __future__ import annotations

import importlib
import os
from pathlib import Path
from typing import Any

_EXPORTS = {
    "DraftTree": "toolspec.core.draft_tree",
    "Engine": "toolspec.core.engine",
    "Generation": "toolspec.core.engine",
    "GenerationParams": "toolspec.core.engine",
    "SamplingParams": "toolspec.core.sampling",
    "StepEvent": "toolspec.core.engine",
    "StepStats": "toolspec.core.engine",
    "TargetModel": "toolspec.model.target_model",
}

__all__ = sorted(_EXPORTS)


def __getattr__(name: str) -> Any:
    if name not in _EXPORTS:
        raise AttributeError(f"module 'toolspec' has no attribute {name!r}")
    return getattr(importlib.import_module(_EXPORTS[name]), name)


def toolspec_home() -> Path:
    """Where toolspec keeps what it makes (converted models, tokenizers, the default call
    library): ``$TOOLSPEC_HOME``, else ``~/.cache/toolspec``."""
    return Path(os.environ.get("TOOLSPEC_HOME", Path.home() / ".cache" / "toolspec"))
