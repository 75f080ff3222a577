"""The project's own engine behind the ``ChatEngine`` seam (``deployments.replica.engine``).

``ToolSpecChatEngine``: the batch scheduler stepping every request in one ragged forward, its
prefix cache, its tensor-parallel group, with ToolSpec's draft trees. It plans a request as
vLLM's engine does (``deployments.replica.request_plan``): the prompt from the ingress (or the
model's chat template), the drafter from the registry for the request's tenant over the
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
import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from transformers.tokenization_utils_base import PreTrainedTokenizerBase

from deployments.messages import ChatRequest
from deployments.ops import metrics
from deployments.replica.engine import EngineSettings, OpenedRequest
from deployments.replica.request_plan import plan_request
from deployments.replica.scheduler import BatchScheduler
from deployments.replica.tensor_parallel_group import TensorParallelGroup
from toolspec.core.drafter import Drafter
from toolspec.core.engine import Engine, GenerationParams, StepReport, StepResult
from toolspec.core.grammar_masks import GrammarCompiler
from toolspec.core.job import DecodeJob
from toolspec.core.prefix_cache import PrefixCache, PrefixCacheStats
from toolspec.library import CallLibrary
from toolspec.model.loading import LoadedModel, dtype_name, freeze_loaded_objects, load_model
from toolspec.model.target_model import TargetModel
from toolspec.model.tensor_parallel import TensorParallelError
from toolspec.registry import DrafterFactory, build_engine

logger = logging.getLogger(f"ray.serve.{__name__}")  # into the replica's Serve log


class ToolSpecChatEngine:
    """The target model with ToolSpec drafting, every open request stepped in one forward by a
    ``BatchScheduler``. Mutates: the engine's budget statistics, the grammar cache, the
    scheduler's jobs."""

    library_wait_s = 0.0  # its drafters read the library view at every step

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
        # The engine may be replaced (``apply``): step whichever is current.
        self._stepping = threading.Lock()
        self.scheduler = BatchScheduler(self.step)
        freeze_loaded_objects()

    def describe(self) -> dict[str, Any]:
        return {"model": self.loaded.name, "engine": "toolspec",
                "dtype": dtype_name(self.loaded.dtype), "device": self.loaded.device.type,
                "context_tokens": self.loaded.model.config.max_position_embeddings,
                "draft_budget": self.settings.draft_budget,
                "step_rows": self.engine.step_rows,
                "tensor_parallel_size": self.loaded.tensor_parallel_size,
                "exact_bf16": self.loaded.exact_bf16,
                "active_requests": self.scheduler.active,
                "prefix_cache": _describe(self.prefix_cache.stats()
                                          if self.prefix_cache is not None else None)}

    def check_health(self) -> None:
        if self.group is not None and not self.group.alive():
            raise TensorParallelError(
                f"a worker rank of this replica's tensor-parallel group "
                f"({self.settings.tensor_parallel_size} ranks) is gone")

    def close(self) -> None:
        self.scheduler.shutdown()
        if self.group is not None:
            self.group.close()

    def apply(self, settings: EngineSettings) -> None:
        """Take a new draft budget, row budget and prefix-cache size (same model, dtype,
        packed rows), between two steps (Serve runs ``reconfigure`` on the replica's event
        loop, the steps run on the scheduler's thread: a step never sees half a change).
        Mutates: the engine; the prefix cache resized in place (blocks past a smaller budget
        dropped, on every rank of a tensor-parallel group)."""
        with self._stepping:
            if settings.prefix_cache_bytes != self.settings.prefix_cache_bytes:
                self.prefix_cache = resized_prefix_cache(self.prefix_cache, self.target,
                                                         settings)
            if (settings.draft_budget, settings.step_rows, settings.prefix_cache_bytes) != \
                    (self.settings.draft_budget, self.settings.step_rows,
                     self.settings.prefix_cache_bytes):
                self.engine = _engine(self.loaded, settings, self.target, self.prefix_cache)
            self.settings = settings

    def open(self, request: ChatRequest, library: CallLibrary | None) -> OpenedRequest:
        plan = plan_request(request, self.loaded.tokenizer, self.settings.model,
                            self.loaded.model.config.max_position_embeddings,
                            self.grammars.added_tokens)
        params = GenerationParams(
            max_new_tokens=plan.max_tokens, stop=plan.stop, sampling=plan.sampling,
            constraint=self.grammars.compile(plan.grammar) if plan.grammar else None)
        # The prompt's blocks are the tenant's in the prefix cache: another tenant's identical
        # prompt never shares them.
        job = self.engine.start(plan.prompt_ids, self._drafter(request, library), params,
                                tools=request.tools, call_format=plan.call_format,
                                conversation=plan.conversation, tenant=request.tenant)
        return OpenedRequest(plan.call_format, len(plan.prompt_ids), self.scheduler.run(job),
                             plan.grammar is not None)

    def step(self, jobs: Sequence[DecodeJob]) -> StepResult:
        """``Engine.step`` (the engine's row budget and prefix cache); its rows and the prefix
        cache's state go to the metrics. Called on the scheduler's thread only."""
        with self._stepping:
            engine = self.engine  # ``apply`` may replace it between steps
            result = engine.step(jobs)
        report = result.report
        if report is not None:
            self.load.add(report)
            metrics.record_rows(report.prompt_rows, report.decode_rows, report.cached_tokens)
        if engine.prefix_cache is not None:
            metrics.record_prefix_cache(engine.prefix_cache.stats())
        return result

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


def resized_prefix_cache(cache: PrefixCache | None, target: TargetModel,
                         settings: EngineSettings) -> PrefixCache | None:
    """The prefix cache at ``settings.prefix_cache_bytes``: ``cache`` itself, its blocks past
    the new budget dropped (through its store: a tensor-parallel group's ranks drop theirs
    too, never left holding blocks nobody indexes); a new one where there was none; none at 0
    (every block dropped)."""
    if settings.prefix_cache_bytes <= 0:
        if cache is not None:
            cache.clear()
        return None
    if cache is None:
        return _prefix_cache(target, settings)
    cache.resize(settings.prefix_cache_bytes)
    return cache


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

