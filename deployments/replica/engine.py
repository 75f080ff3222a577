"""The seam a model replica is built on: ``ChatEngine`` — a chat request in, its decoding steps
out — and ``EngineSettings``, what a replica loads.

``open`` plans a request and gives the steps it will stream; the engine batches every open
request as it likes. Two engines serve: ``deployments.replica.vllm_engine.VLLMChatEngine``
(vLLM's async engine with the ToolSpec proposer; shipped) and
``deployments.replica.toolspec_engine.ToolSpecChatEngine`` (the project's own loop with
ToolSpec's draft trees); ``deployments.replica.model_replica.build_chat_engine`` picks one from
``EngineSettings.engine``. Tests inject a scripted engine.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import Any, Literal, Protocol

from deployments.messages import ChatRequest
from toolspec.calls.formats import CallFormat
from toolspec.core.generation import StepEvent
from toolspec.library import CallLibrary
from toolspec.model.packages import DEFAULT_MODEL

EngineKind = Literal["toolspec", "vllm"]
# What a vLLM engine drafts with: the ToolSpec proposer (``toolspec``: call grammar, call
# library, suffix fallback; ``toolspec-schema``: without the library), vLLM's own
# SuffixDecoding (``suffix``, Arctic Inference) or n-gram prompt lookup (``ngram``), or nothing.
SpeculativeMethod = Literal["toolspec", "toolspec-schema", "suffix", "ngram", "none"]


@dataclass(frozen=True)
class EngineSettings:
    """What a replica loads: which engine, the model, its dtype, and how it drafts.

    The project's engine (``engine: toolspec``) verifies draft trees of ``draft_budget`` nodes
    (``auto``: sized to this machine's measured cost curve, measured once and cached); vLLM's
    (``engine: vllm``) verifies one chain of at most ``speculative_tokens`` per request per
    step, drafted by ``speculative_method``."""

    model: str = DEFAULT_MODEL
    dtype: str = "auto"
    engine: EngineKind = "toolspec"
    draft_budget: int | Literal["auto"] = "auto"
    # The replica's prefix cache: prompt blocks shared by a tenant's requests (LRU under this
    # many bytes of keys and values); 0 turns it off. vLLM: any size but 0 turns its own on
    # (its blocks live in its KV cache, ``kv_cache_gib``).
    prefix_cache_bytes: int = 1 << 30
    # fp32 on CPU: linear weights prepacked for oneDNN (faster steps, cheap verification; the
    # packed copy costs the weights' memory again). False: PyTorch's stock kernels.
    prepack_linear: bool = True
    # Rows a forward runs at most while requests decode: decoding first, prompt chunks (whole
    # blocks) fill the rest, so a long prompt slows the others' steps by a bounded factor.
    # auto: from the cost curve (toolspec.core.budget.rows_per_step); 0: no limit. vLLM: its
    # max_num_batched_tokens (auto: vLLM's default).
    step_rows: int | Literal["auto"] = "auto"
    # Ranks holding a part of every layer: the replica and N-1 worker actors in its placement
    # group (deployments.replica.tensor_parallel_group); vLLM: its tensor_parallel_size (its own
    # workers). 1: the whole model in the replica.
    tensor_parallel_size: int = 1
    # bf16 on CPU: speculative outputs bitwise plain decoding's, at a cost per
    # verified row (docs/benchmarks.md); plain decoding runs through the same kernels.
    exact_bf16: bool = False
    # vLLM only: the proposer, the longest chain, the KV cache (GiB; on a GPU, the share of
    # its memory vLLM may use is gpu_memory_utilization), the cores its CPU kernels run on
    # (VLLM_CPU_OMP_THREADS_BIND: "auto", "0", "0-3", ...), and whether it compiles its
    # model graph at start (false: eager, a faster start).
    speculative_method: SpeculativeMethod = "toolspec"
    speculative_tokens: int = 16
    # The ToolSpec proposer's chains stop before a token whose calibrated chance of being
    # reached is lower (each verified token costs a row; on a compute-bound CPU, most).
    min_reach: float = 0.3
    # vLLM's KV block (its prefix cache's unit): tool-calling prompts share long starts that
    # end anywhere, and a 32-token block keeps more of them than its CPU default of 128.
    kv_block_tokens: int | None = 32
    kv_cache_gib: float = 4.0
    gpu_memory_utilization: float = 0.85
    cpu_threads: str = "auto"
    compile: bool = True


@dataclass(frozen=True)
class OpenedRequest:
    """An opened request: how its output is written, and its steps (nothing runs until they
    are iterated; leaving the iteration early ends the request and frees its slot)."""

    call_format: CallFormat
    prompt_tokens: int
    steps: AsyncIterator[StepEvent]
    constrained: bool = False  # decoding is grammar-constrained


class ChatEngine(Protocol):
    # How long the replica may wait, before ``open``, for the request's tools' past calls to
    # arrive from the retrieval actor (an engine whose drafts read the library view only at a
    # request's start waits; one that reads it every step does not).
    library_wait_s: float

    def open(self, request: ChatRequest, library: CallLibrary | None) -> OpenedRequest:
        """Plan the request (prompt, drafter, grammar); its steps run with every other open
        request's, batched as the engine does. Raises ``ContextLengthError``."""

    def apply(self, settings: EngineSettings) -> None:
        """Take new settings that need no reload (budgets, cache sizes)."""

    def describe(self) -> dict[str, Any]:
        """What is loaded: ``model``, ``dtype``, ``context_tokens``, ``engine``,
        ``active_requests`` (for ``/v1/models`` and ``/health``)."""

    def check_health(self) -> None:
        """Raise if the engine can no longer serve (a rank of its model or its engine process
        is lost): Serve then replaces the replica."""

    def close(self) -> None:
        """Stop serving and let go of what the engine holds beyond this process (worker ranks,
        engine processes). Idempotent."""
