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

from collections.abc import AsyncIterator, Mapping
from dataclasses import dataclass
from typing import Any, Literal, Protocol

from pydantic import BaseModel, ConfigDict, Field, model_validator

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


class EngineSettings(BaseModel):
    """What a replica loads: which engine, the model, its dtype, and how it drafts — each
    setting defined here once, with its checks. ``deployments.app.builder.ModelConfig`` is
    these settings and the deployment's own; a live ``user_config`` is checked the same way
    (``updated``).

    The project's engine (``engine: toolspec``) verifies draft trees of ``draft_budget`` nodes
    (``auto``: sized to this machine's measured cost curve, measured once and cached); vLLM's
    (``engine: vllm``) verifies one chain of at most ``speculative_tokens`` per request per
    step, drafted by ``speculative_method``."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    model: str = DEFAULT_MODEL
    dtype: str = "auto"
    engine: EngineKind = Field(
        "toolspec", description="toolspec: the project's engine (draft trees, its batch "
                                "scheduler, prefix cache and tensor-parallel group); vllm: "
                                "vLLM's engine with the ToolSpec proposer (one draft chain per "
                                "request per step)")
    speculative_method: SpeculativeMethod = Field(
        "toolspec", description="engine vllm: toolspec (call grammar + call library + suffix "
                                "fallback), toolspec-schema (without the library), suffix "
                                "(vLLM's SuffixDecoding), ngram (vLLM's prompt lookup), none")
    speculative_tokens: int = Field(16, ge=1, le=128,
                                    description="engine vllm: the longest draft chain")
    min_reach: float = Field(
        0.3, ge=0, le=1, description="engine vllm: a draft chain stops before a token whose "
                                     "calibrated chance of being reached is lower (each "
                                     "verified token costs a row; on a compute-bound CPU, "
                                     "most)")
    step_draft_tokens: int | None = Field(
        32, ge=1, description="engine vllm, the ToolSpec proposer: draft tokens one step "
                              "verifies across all its requests at most, the likeliest kept "
                              "(each chain keeps a prefix); on a compute-bound machine every "
                              "verified row costs, and a batch's unlikely tails cost most. "
                              "null: no cap (each chain only by speculative_tokens)")
    kv_block_tokens: int | None = Field(
        32, ge=16, description="engine vllm: its KV block, the unit its prefix cache shares "
                               "(tool-calling prompts share long starts that end anywhere; "
                               "null: vLLM's default, 128 on CPU)")
    kv_cache_gib: float = Field(4.0, gt=0, description="engine vllm on CPU: its KV cache")
    gpu_memory_utilization: float = Field(0.85, gt=0, le=1,
                                          description="engine vllm on a GPU: its memory share")
    cpu_threads: str = Field(
        "auto", pattern=r"^(auto|nobind|[0-9,\-|]+)$",
        description="engine vllm on CPU: the cores its kernels run on "
                    "(VLLM_CPU_OMP_THREADS_BIND: auto, 0, 0-3, ...)")
    compile: bool = Field(True, description="engine vllm: compile the model graph at start "
                                            "(faster steps; about a minute the first time, "
                                            "cached after); false: eager")
    draft_budget: int | Literal["auto"] = Field(
        "auto", description="nodes verified per step; auto: the tree that pays most on this "
                            "machine's measured verification cost curve")
    prepack_linear: bool = Field(
        True, description="fp32 on CPU: linear weights prepacked for oneDNN (faster steps, "
                          "cheap verification, the weights' memory again; false for "
                          "PyTorch's stock kernels)")
    step_rows: int | Literal["auto"] = Field(
        "auto", description="rows a forward runs at most while requests decode: decoding "
                            "first, prompt chunks (whole blocks) fill the rest; auto: the "
                            "fewest rows at which a row costs within 10% of the cheapest on "
                            "this machine's cost curve; 0: no limit; vLLM: its "
                            "max_num_batched_tokens (auto: vLLM's default)")
    prefix_cache_bytes: int = Field(
        1 << 30, ge=0, description="the replica's prefix cache: keys and values of prompt "
                                   "blocks shared by a tenant's requests, least recently used "
                                   "evicted past this many bytes; 0: off (vLLM: any size but "
                                   "0 turns its own on, its blocks in its KV cache)")
    exact_bf16: bool = Field(
        False, description="bf16 on CPU: speculative outputs bitwise plain decoding's, at a "
                           "cost per verified row (docs/serving.md, 'Exact bf16')")
    tensor_parallel_size: int = Field(
        1, ge=1, le=64, description="ranks per replica, each holding a part of every layer "
                                    "(must divide the model's key/value heads); vLLM: its "
                                    "tensor_parallel_size (its own workers)")

    @model_validator(mode="after")
    def _engine_fits(self) -> EngineSettings:
        if self.engine == "vllm" and self.exact_bf16:
            raise ValueError("exact_bf16 is the project's engine's (engine: toolspec); vLLM's "
                             "kernels have no such mode here")
        return self

    @model_validator(mode="after")
    def _rows_valid(self) -> EngineSettings:
        if self.step_rows != "auto" and self.step_rows < 0:
            raise ValueError(f"step_rows must be 'auto' or >= 0 (0: no limit), got "
                             f"{self.step_rows}")
        return self

    def updated(self, changes: Mapping[str, Any]) -> EngineSettings:
        """These settings with ``changes`` (a ``user_config``), checked as at deploy time:
        raises ``pydantic.ValidationError`` naming the field."""
        return type(self).model_validate({**self.fields(), **changes})

    def fields(self) -> dict[str, Any]:
        """The settings as plain values (what a Serve deployment is bound with)."""
        return self.model_dump(include=set(EngineSettings.model_fields))


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
