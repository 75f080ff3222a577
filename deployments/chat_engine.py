"""The engine behind a replica: a chat request in, a decoding job out; many jobs per step.

``ChatEngine`` is the seam the replica is built on: ``open`` turns a request into a job,
``step`` runs one step of many jobs in one forward. ``ToolSpecChatEngine`` runs the real model
with ToolSpec drafting; tests inject a scripted engine. The prompt comes from the ingress (or
the model's chat template); the drafter from the registry, for the request's tenant, over the
replica's library view.

Constrained requests (``ChatRequest.constrained``: ``tool_choice`` required or named,
``strict``, or ``response_format``) decode under a grammar compiled from the offered tools'
schemas in the request's call format (``toolspec.calls.tool_grammar``): required / named allow only
calls (named: exactly one), strict with ``auto`` allows free text whose calls, once opened, are
schema-valid, and ``response_format`` makes the answer the JSON document its schema describes. The
masks compose with speculation (``toolspec.core.grammar_masks``): the output is exactly masked
plain decoding's. Grammars are compiled once per (tools, format, shape) and cached. ``auto``
without strict is unconstrained, lossless speculation of the model's own output.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, Literal, Protocol

from transformers.tokenization_utils_base import PreTrainedTokenizerBase

from deployments import metrics
from deployments.messages import ChatRequest, ContextLengthError, context_message
from deployments.scheduler import Job
from deployments.tensor_parallel_group import TensorParallelGroup
from toolspec.calls.formats import CallFormat, get_format
from toolspec.calls.prompts import chat_prompt, conversation_text
from toolspec.calls.tool_grammar import answer_grammar, tool_call_grammar
from toolspec.core.drafter import Drafter
from toolspec.core.engine import Engine, GenerationParams, StepReport, StepResult
from toolspec.core.grammar_masks import GrammarCompiler, GrammarConstraint
from toolspec.core.job import DecodeJob
from toolspec.core.prefix_cache import PrefixCache, PrefixCacheStats
from toolspec.core.sampling import SamplingParams
from toolspec.library import CallLibrary
from toolspec.model.loading import LoadedModel, dtype_name, freeze_loaded_objects, load_model
from toolspec.model.packages import DEFAULT_MODEL
from toolspec.model.target_model import TargetModel
from toolspec.model.tensor_parallel import TensorParallelError
from toolspec.registry import DrafterFactory, build_engine

logger = logging.getLogger(f"ray.serve.{__name__}")  # into the replica's Serve log


@dataclass(frozen=True)
class EngineSettings:
    """What a replica loads: the model, its dtype, and how many draft nodes a step verifies
    (``auto``: sized to this machine's measured cost curve, measured once and cached)."""

    model: str = DEFAULT_MODEL
    dtype: str = "auto"
    draft_budget: int | Literal["auto"] = "auto"
    # The replica's prefix cache: prompt blocks shared by a tenant's requests (LRU under this
    # many bytes of keys and values); 0 turns it off.
    prefix_cache_bytes: int = 1 << 30
    # fp32 on CPU: linear weights prepacked for oneDNN (faster steps, cheap verification; the
    # packed copy costs the weights' memory again). False: PyTorch's stock kernels.
    prepack_linear: bool = True
    # Rows a forward runs at most while requests decode: decoding first, prompt chunks (whole
    # blocks) fill the rest, so a long prompt slows the others' steps by a bounded factor.
    # auto: from the cost curve (toolspec.core.budget.rows_per_step); 0: no limit.
    step_rows: int | Literal["auto"] = "auto"
    # Ranks holding a part of every layer: the replica and N-1 worker actors in its placement
    # group (deployments.tensor_parallel_group). 1: the whole model in the replica.
    tensor_parallel_size: int = 1
    # bf16 on CPU: speculative outputs bitwise plain decoding's, at a cost per
    # verified row (docs/benchmarks.md); plain decoding runs through the same kernels.
    exact_bf16: bool = False


@dataclass(frozen=True)
class OpenedRequest:
    """An opened request: how its output is written, and its job (not yet run: the
    replica's scheduler steps it with the others, through ``ChatEngine.step``)."""

    call_format: CallFormat
    prompt_tokens: int
    job: Job
    constrained: bool = False  # decoding is grammar-constrained


class ChatEngine(Protocol):
    def open(self, request: ChatRequest, library: CallLibrary | None) -> OpenedRequest:
        """Build the prompt, drafter and job; nothing runs until ``step`` runs the job."""

    def step(self, jobs: Sequence[Job]) -> StepResult:
        """One step of every job in one forward (``Engine.step``); per job its event, its
        failure, or None when it sat the step out. Called on the scheduler's thread only."""

    def apply(self, settings: EngineSettings) -> None:
        """Take new settings of the same model, dtype and weight packing (budgets)."""

    def describe(self) -> dict[str, Any]:
        """What is loaded: ``model``, ``dtype``, ``context_tokens`` (for ``/v1/models`` and
        ``/health``)."""

    def check_health(self) -> None:
        """Raise if the engine can no longer serve (a rank of its model is lost): Serve then
        replaces the replica."""

    def close(self) -> None:
        """Let go of what the engine holds beyond this process (worker ranks). Idempotent."""


class ToolSpecChatEngine:
    """The target model with ToolSpec drafting. Mutates: the engine's budget statistics, the
    grammar cache."""

    def __init__(self, settings: EngineSettings) -> None:
        self.settings = settings
        self.group: TensorParallelGroup | None = None
        if settings.tensor_parallel_size > 1:
            self.group = TensorParallelGroup(settings.model, settings.dtype,
                                             settings.tensor_parallel_size)
            self.loaded, self.target = self.group.loaded, self.group.target
        else:
            self.loaded = load_model(settings.model, settings.dtype,
                                     prepack_linear=settings.prepack_linear,
                                     exact_bf16=settings.exact_bf16)
            self.target = TargetModel(self.loaded.model)
        self.prefix_cache = _prefix_cache(self.target, settings)
        self.engine = _engine(self.loaded, settings, self.target, self.prefix_cache)
        self.drafters = ServedDrafters(self.loaded.tokenizer)
        self.load = StepLoad()
        # Built at load (seconds for a large vocabulary), not on the first strict request.
        self.grammars = GrammarCompiler(
            self.loaded.tokenizer, self.loaded.model.get_output_embeddings().weight.shape[0],
            self.engine.stop_token_ids)
        freeze_loaded_objects()

    def describe(self) -> dict[str, Any]:
        return {"model": self.loaded.name, "dtype": dtype_name(self.loaded.dtype),
                "context_tokens": self.loaded.model.config.max_position_embeddings,
                "draft_budget": self.settings.draft_budget,
                "step_rows": self.engine.step_rows,
                "tensor_parallel_size": self.loaded.tensor_parallel_size,
                "exact_bf16": self.loaded.exact_bf16,
                "prefix_cache": _describe(self.prefix_cache.stats()
                                          if self.prefix_cache is not None else None)}

    def check_health(self) -> None:
        if self.group is not None and not self.group.alive():
            raise TensorParallelError(
                f"a worker rank of this replica's tensor-parallel group "
                f"({self.settings.tensor_parallel_size} ranks) is gone")

    def close(self) -> None:
        if self.group is not None:
            self.group.close()

    def apply(self, settings: EngineSettings) -> None:
        """Take a new draft budget, row budget and prefix-cache size (same model, dtype,
        packed rows). Called between steps (Serve runs ``reconfigure`` on the replica's event
        loop; the scheduler reads ``engine`` once per step). Mutates: the engine; the prefix
        cache only when its size changes (a new, empty one)."""
        if settings.prefix_cache_bytes != self.settings.prefix_cache_bytes:
            self.prefix_cache = _prefix_cache(self.target, settings)
        if (settings.draft_budget, settings.step_rows, settings.prefix_cache_bytes) != \
                (self.settings.draft_budget, self.settings.step_rows,
                 self.settings.prefix_cache_bytes):
            self.engine = _engine(self.loaded, settings, self.target, self.prefix_cache)
        self.settings = settings

    def open(self, request: ChatRequest, library: CallLibrary | None) -> OpenedRequest:
        prompt, call_format = self._prompt(request)
        context = self.loaded.model.config.max_position_embeddings
        if len(prompt) + request.max_tokens > context:
            raise ContextLengthError(context_message(len(prompt), request.max_tokens, context))
        stop = request.stop
        if request.parses_calls and not request.parallel_calls and call_format.call_close:
            stop = (*stop, call_format.call_close)  # one call, then the output ends
        params = GenerationParams(
            max_new_tokens=request.max_tokens, stop=stop,
            sampling=SamplingParams(request.temperature, request.top_p, request.top_k,
                                    seed=request.seed),
            constraint=self._constraint(request, call_format))
        # The prompt's blocks are the tenant's in the prefix cache: another tenant's identical
        # prompt never shares them.
        job = self.engine.start(prompt, self._drafter(request, library), params,
                                tools=request.tools, call_format=call_format,
                                conversation=conversation_text(request.messages),
                                tenant=request.tenant)
        return OpenedRequest(call_format, len(prompt), job, params.constraint is not None)

    def step(self, jobs: Sequence[DecodeJob]) -> StepResult:
        """``Engine.step`` (the engine's row budget and prefix cache); its rows and the prefix
        cache's state go to the metrics."""
        engine = self.engine  # ``apply`` may replace it between steps
        result = engine.step(jobs)
        report = result.report
        if report is not None:
            self.load.add(report)
            metrics.record_rows(report.prompt_rows, report.decode_rows, report.cached_tokens)
        if engine.prefix_cache is not None:
            metrics.record_prefix_cache(engine.prefix_cache.stats())
        return result

    def _prompt(self, request: ChatRequest) -> tuple[list[int], CallFormat]:
        """The ingress's rendering when it used this model's tokenizer, else our own."""
        if request.prompt_ids is not None and request.prompt_model == self.settings.model \
                and request.call_format is not None:
            return list(request.prompt_ids), get_format(request.call_format)
        return chat_prompt(self.loaded.tokenizer, request.messages, request.openai_tools or None)

    def _constraint(self, request: ChatRequest, call_format: CallFormat
                    ) -> GrammarConstraint | None:
        """The compiled grammar a constrained request decodes under (None: unconstrained)."""
        if not request.constrained:
            return None
        if not request.parses_calls:  # response_format alone
            return self.grammars.compile(answer_grammar(request.answer_schema))
        shape = "calls" if request.forces_call else "text_or_calls"
        return self.grammars.compile(tool_call_grammar(
            request.tools.tools, call_format, shape, request.parallel_calls,
            self.grammars.added_tokens, None if request.forces_call else request.answer_schema))

    def _drafter(self, request: ChatRequest, library: CallLibrary | None) -> Drafter:
        return self.drafters.for_request(request, library)


@dataclass
class StepLoad:
    """Totals of the replica's steps, logged every ``every_s`` seconds: how many requests a
    forward carries, how its rows divide between prompts and decoding, and how much of a step
    the forward takes (the rest is drafting, walking and committing). Mutates: its totals."""

    every_s: float = 60.0
    steps: int = 0
    jobs: int = 0
    prompt_rows: int = 0
    decode_rows: int = 0
    forward_s: float = 0.0
    step_s: float = 0.0
    _logged: float = field(default_factory=time.monotonic)

    def add(self, report: StepReport) -> None:
        self.steps += 1
        self.jobs += report.jobs
        self.prompt_rows += report.prompt_rows
        self.decode_rows += report.decode_rows
        self.forward_s += report.forward_s
        self.step_s += report.step_s
        if time.monotonic() - self._logged >= self.every_s:
            self._logged = time.monotonic()
            logger.info("steps: %s", self.summary())

    def summary(self) -> str:
        steps = max(1, self.steps)
        return (f"{self.steps} steps, {self.jobs / steps:.2f} requests per forward, "
                f"{self.prompt_rows} prompt rows and {self.decode_rows} decoding rows, "
                f"forward {self.forward_s:.1f} s of {self.step_s:.1f} s stepping "
                f"({self.forward_s / max(self.step_s, 1e-9):.0%})")


class ServedDrafters:
    """The drafters a replica gives its requests: the registry's ``toolspec`` (without a call
    library, ``toolspec-schema``) for each request's tenant, over that tenant's memory (what
    the benchmark's drafters learn across items, a replica's learn across requests). The
    replica records finished calls itself (``learn`` off). Mutates: the tenants' memories."""

    def __init__(self, tokenizer: PreTrainedTokenizerBase) -> None:
        self.with_library = DrafterFactory("toolspec", tokenizer)
        self.without_library = self.with_library.sibling("toolspec-schema")

    def for_request(self, request: ChatRequest, library: CallLibrary | None) -> Drafter:
        factory = self.with_library if library is not None else self.without_library
        return factory.for_request(request.tenant, request.tools is not None, library)


def _engine(loaded: LoadedModel, settings: EngineSettings, target: TargetModel,
            prefix_cache: PrefixCache | None) -> Engine:
    return build_engine(loaded, None if settings.draft_budget == "auto"
                        else settings.draft_budget, step_rows=settings.step_rows,
                        prefix_cache=prefix_cache, target=target)


def _prefix_cache(target: TargetModel, settings: EngineSettings) -> PrefixCache | None:
    if settings.prefix_cache_bytes <= 0:
        return None
    return PrefixCache(target, settings.prefix_cache_bytes, target.block_tokens)


def _describe(stats: PrefixCacheStats | None) -> dict[str, Any] | None:
    """The prefix cache as ``/v1/models`` shows it."""
    if stats is None:
        return None
    return {"blocks": stats.blocks, "block_tokens": stats.block_tokens, "bytes": stats.bytes,
            "budget_bytes": stats.budget_bytes, "hit_rate": round(stats.hit_rate, 4),
            "evicted_blocks": stats.evicted_blocks}

