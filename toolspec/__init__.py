"""ToolSpec: training-free, lossless speculative decoding for LLM tool calls."""

from toolspec.draft_tree import DraftTree
from toolspec.engine import Engine, Generation, GenerationParams, StepEvent, StepStats
from toolspec.sampling import SamplingParams
from toolspec.target_model import TargetModel

__all__ = [
    "DraftTree",
    "Engine",
    "Generation",
    "GenerationParams",
    "SamplingParams",
    "StepEvent",
    "StepStats",
    "TargetModel",
]
