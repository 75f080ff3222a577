"""vLLM as a replica's engine, drafting with the ToolSpec proposer.

``VLLMChatEngine`` holds a vLLM ``AsyncLLM`` (continuous batching, paged KV cache with prefix
caching, chunked prefill, its CPU or GPU kernels, tensor parallelism through its own workers)
whose speculative method is ``toolspec.vllm.proposer.ToolSpecProposer`` — or, to compare
engines on one deployment, vLLM's own SuffixDecoding or n-gram proposer, or none. The replica's
side is unchanged: a request is planned as the project's engine plans it
(``deployments.replica.request_plan``), and its output is read through the request's one parse
(``RequestOutput``: text, calls, visible text held back before a stop string), so tool-call
parsing, streaming, the Responses API and the library all work as on the project's engine.

What a request brings to the proposer (tools, call format, tenant, the conversation, the
tenant's past calls of those tools from the replica's library view) rides in
``SamplingParams.extra_args`` (``toolspec.vllm.request``). The prefix cache is salted per tenant
(``cache_salt``): one tenant's prompt blocks never serve another's. Constrained requests decode
under vLLM's structured outputs (guidance backend: llguidance, the same Lark grammar the
project's engine compiles), which masks drafted positions too. Each request's acceptance comes
back in vLLM's per-request speculative-decoding metrics and becomes its ``Generation``'s steps.

vLLM runs its engine in processes of its own; if they die, ``check_health`` raises and Serve
replaces the replica, and requests in flight end with an error event (the ingress retries a
request once before any output reached the client).

Mutates: the vLLM engine's requests; ``os.environ`` of this process once, at start, for the
settings its processes read only from there (CPU thread binding, the proposer's settings).
"""

from __future__ import annotations

import asyncio
import logging
import os
import time
import uuid
from collections.abc import AsyncIterator
from typing import Any

from transformers import AutoConfig
from vllm import SamplingParams as VLLMSamplingParams
from vllm.engine.arg_utils import AsyncEngineArgs
from vllm.inputs import TokensPrompt
from vllm.sampling_params import RequestOutputKind, StructuredOutputsParams
from vllm.v1.engine.async_llm import AsyncLLM

from deployments.messages import ChatRequest
from deployments.ops import metrics
from deployments.replica.engine import EngineSettings, OpenedRequest
from deployments.replica.request_plan import RequestPlan, plan_request
from toolspec.calls.output import RequestOutput
from toolspec.calls.tool_grammar import added_token_ids
from toolspec.core.generation import Generation, StepEvent, StepStats
from toolspec.core.stopping import cut_at_stop_string
from toolspec.core.text_stream import TextDeltas
from toolspec.library import CallLibrary
from toolspec.model.loading import default_device, dtype_name, parse_dtype
from toolspec.model.packages import load_tokenizer, resolve_model_dir
from toolspec.vllm.proposer import (
    ATTACH_METHOD,
    STATS_METHOD,
    WORKER_EXTENSION_CLASS,
    speculative_config,
)
from toolspec.vllm.request import DraftingRequest, past_calls

logger = logging.getLogger(f"ray.serve.{__name__}")  # into the replica's Serve log

# vLLM's own proposers, as ``EngineSettings.speculative_method`` names them.
_VLLM_METHODS = {"suffix": "suffix", "ngram": "ngram"}
_TOOLSPEC_METHODS = frozenset({"toolspec", "toolspec-schema"})


class EngineStoppedError(RuntimeError):
    """vLLM's engine stopped (its process died, or the replica closed it)."""


def engine_args(settings: EngineSettings) -> AsyncEngineArgs:
    """vLLM's engine arguments for ``settings`` (the model converted to safetensors once,
    under ``$TOOLSPEC_HOME``)."""
    model_dir = str(resolve_model_dir(settings.model))
    device = default_device()
    method = settings.speculative_method
    speculative: dict[str, Any] | None = None
    if method in _TOOLSPEC_METHODS:
        speculative = speculative_config(settings.speculative_tokens)
    elif method in _VLLM_METHODS:
        speculative = {"method": _VLLM_METHODS[method],
                       "num_speculative_tokens": settings.speculative_tokens}
        if method == "ngram":
            speculative.update(prompt_lookup_min=2, prompt_lookup_max=5)
    options: dict[str, Any] = {}
    if device.type == "cpu":
        options["kv_cache_memory_bytes"] = int(settings.kv_cache_gib * (1 << 30))
    else:
        options["gpu_memory_utilization"] = settings.gpu_memory_utilization
    if settings.kv_block_tokens is not None:
        options["block_size"] = settings.kv_block_tokens
    if settings.step_rows not in ("auto", 0):
        options["max_num_batched_tokens"] = int(settings.step_rows)
    if settings.tensor_parallel_size > 1 and device.type == "cuda":
        options["distributed_executor_backend"] = "ray"  # its workers in our placement group
    return AsyncEngineArgs(
        model=model_dir, served_model_name=settings.model, tokenizer=model_dir,
        dtype=parse_dtype(settings.dtype, device),
        max_model_len=AutoConfig.from_pretrained(model_dir).max_position_embeddings,
        enable_prefix_caching=settings.prefix_cache_bytes > 0,
        tensor_parallel_size=settings.tensor_parallel_size,
        speculative_config=speculative,
        worker_extension_cls=WORKER_EXTENSION_CLASS,
        per_request_spec_decode_metrics="detailed" if speculative else "none",
        structured_outputs_config={"backend": "guidance"},
        enforce_eager=not settings.compile,
        disable_log_stats=False,
        **options)


def proposer_environment(settings: EngineSettings) -> dict[str, str | None]:
    """The ToolSpec proposer's settings as the variables its worker process reads
    (``toolspec.vllm.proposer``; None: unset, its default)."""
    return {"TOOLSPEC_PROPOSER_MIN_REACH": str(settings.min_reach),
            "TOOLSPEC_PROPOSER_STEP_TOKENS": None if settings.step_draft_tokens is None
            else str(settings.step_draft_tokens)}


class VLLMChatEngine:
    """A replica's requests on one vLLM ``AsyncLLM``. Mutates: the engine's requests."""

    # The proposer reads a request's past calls once, when it starts: give the prefetch from
    # the retrieval actor a moment to bring them (a local actor answers in milliseconds; the
    # wait ends as soon as it has), never long enough to weigh on the time to first token.
    library_wait_s = 0.05

    def __init__(self, settings: EngineSettings) -> None:
        self.settings = settings
        if settings.cpu_threads != "auto":
            os.environ["VLLM_CPU_OMP_THREADS_BIND"] = settings.cpu_threads
        # Read by the proposer in vLLM's worker process, which inherits this environment.
        for name, value in proposer_environment(settings).items():
            if value is None:
                os.environ.pop(name, None)
            else:
                os.environ[name] = value
        self.args = engine_args(settings)
        self.tokenizer = load_tokenizer(settings.model)
        self.added_tokens = added_token_ids(self.tokenizer)
        self.context_tokens = int(self.args.max_model_len)
        self.engine = AsyncLLM.from_engine_args(self.args)
        self._attached: asyncio.Task | None = None
        self._reporter: asyncio.Task | None = None
        self._active = 0
        self._closed = False

    # ---- the seam ----------------------------------------------------------------------------

    def open(self, request: ChatRequest, library: CallLibrary | None) -> OpenedRequest:
        if self._closed:
            raise EngineStoppedError("the vLLM engine is closed")
        plan = self.plan(request)
        return OpenedRequest(plan.call_format, len(plan.prompt_ids),
                             self._steps(request, plan, self.sampling_params(request, plan,
                                                                             library)),
                             plan.grammar is not None)

    def plan(self, request: ChatRequest) -> RequestPlan:
        """``request`` as this engine's model runs it (``plan_request``)."""
        return plan_request(request, self.tokenizer, self.settings.model, self.context_tokens,
                            self.added_tokens)

    def apply(self, settings: EngineSettings) -> None:
        """Nothing applies in place: vLLM takes its settings at start (``ModelServer``
        reloads the engine for any change)."""

    def describe(self) -> dict[str, Any]:
        return {"model": self.settings.model, "engine": "vllm",
                "dtype": dtype_name(self.args.dtype),
                "device": self.engine.vllm_config.device_config.device_type,
                "context_tokens": self.context_tokens,
                "speculative_method": self.settings.speculative_method,
                "speculative_tokens": self.settings.speculative_tokens,
                "step_draft_tokens": self.settings.step_draft_tokens,
                "tensor_parallel_size": self.settings.tensor_parallel_size,
                # vLLM keeps prompt blocks in its KV cache (salted per tenant).
                "prefix_cache": {"block_tokens": self.engine.vllm_config.cache_config.block_size,
                                 "budget_bytes": self.args.kv_cache_memory_bytes}
                if self.args.enable_prefix_caching else None,
                "active_requests": self._active}

    def check_health(self) -> None:
        if self.engine.errored:
            raise EngineStoppedError("vLLM's engine process is gone; this replica cannot serve")

    def close(self) -> None:
        if not self._closed:
            self._closed = True
            if self._reporter is not None:  # close may run on another thread (a reload)
                self._reporter.get_loop().call_soon_threadsafe(self._reporter.cancel)
            self.engine.shutdown()

    async def proposer_stats(self) -> dict[str, Any] | None:
        """The ToolSpec proposer's totals (``ProposerStats``), None without it."""
        if self.settings.speculative_method not in _TOOLSPEC_METHODS:
            return None
        answers = await self.engine.collective_rpc(STATS_METHOD)
        return next((answer for answer in answers if answer is not None), None)

    # ---- one request -------------------------------------------------------------------------

    def sampling_params(self, request: ChatRequest, plan: RequestPlan,
                        library: CallLibrary | None) -> VLLMSamplingParams:
        """vLLM's sampling parameters for ``request``: its decoding settings, its stops, its
        grammar, and what it brings to the proposer (``DraftingRequest``, its tenant's past
        calls of its tools from ``library``)."""
        sampling = plan.sampling
        drafting = DraftingRequest(
            tenant=request.tenant,
            method=self.settings.speculative_method
            if self.settings.speculative_method in _TOOLSPEC_METHODS else None,
            call_format=plan.call_format.name,
            tools=tuple(request.openai_tools) if request.parses_calls else (),
            conversation=plan.conversation,
            past_calls=past_calls(library, request.tenant, request.tools.names)
            if library is not None and request.parses_calls else ())
        return VLLMSamplingParams(
            max_tokens=plan.max_tokens, stop=list(plan.stop) or None,
            temperature=sampling.temperature, top_p=sampling.top_p,
            top_k=sampling.top_k if sampling.top_k > 0 else 0, seed=sampling.seed,
            output_kind=RequestOutputKind.DELTA, skip_special_tokens=True,
            detokenize=bool(plan.stop),  # vLLM finds stop strings in its own text
            structured_outputs=StructuredOutputsParams(grammar=plan.grammar)
            if plan.grammar else None,
            extra_args=drafting.to_extra_args())

    async def ready(self) -> None:
        """Show the proposer its worker's batch (once, before the first request), and start
        reporting what it drafts to the metrics."""
        if self.settings.speculative_method not in _TOOLSPEC_METHODS:
            return
        if self._attached is None:
            self._attached = asyncio.ensure_future(self.engine.collective_rpc(ATTACH_METHOD))
            self._reporter = asyncio.ensure_future(self._report_drafts())
        attached = await asyncio.shield(self._attached)
        if not any(attached):
            raise EngineStoppedError("vLLM's workers hold no ToolSpec proposer")

    async def _report_drafts(self, every_s: float = 15.0) -> None:
        """Every ``every_s``, the proposer's accepted draft tokens by source since the last
        report, into the metrics (vLLM's per-request figures do not say which source drafted
        what)."""
        reported: dict[str, int] = {}
        while not self._closed:
            await asyncio.sleep(every_s)
            try:
                stats = await self.proposer_stats()
            except Exception as error:  # noqa: BLE001 - the engine's health check reports it
                logger.warning("the proposer's statistics are unavailable: %r", error)
                continue
            totals = (stats or {}).get("accepted_by_source", {})
            metrics.record_accepted({source: count - reported.get(source, 0)
                                     for source, count in totals.items()})
            reported = dict(totals)

    async def _steps(self, request: ChatRequest, plan: RequestPlan, params: VLLMSamplingParams
                     ) -> AsyncIterator[StepEvent]:
        """The request's steps as vLLM delivers them (one delivery may hold several steps'
        tokens when this loop falls behind); the last carries the ``Generation``."""
        await self.ready()
        self._active += 1
        started = time.perf_counter()
        first_s: float | None = None
        output = RequestOutput(self.tokenizer, plan.call_format)
        deltas = TextDeltas(plan.stop)
        prompt = TokensPrompt(prompt_token_ids=list(plan.prompt_ids),
                              cache_salt=f"tenant:{request.tenant}")
        request_id = f"{request.request_id}-{uuid.uuid4().hex[:8]}"  # unique even on retries
        try:
            async for delivered in self.engine.generate(prompt, params, request_id):
                completion = delivered.outputs[0]
                tokens = tuple(completion.token_ids)
                for token in tokens:
                    output.append(token)
                if tokens and first_s is None:
                    first_s = time.perf_counter()
                if not delivered.finished:
                    yield StepEvent(tokens, deltas.update(output.text), None,
                                    calls=output.parse.spans)
                    continue
                if completion.finish_reason not in ("stop", "length"):
                    raise EngineStoppedError(f"vLLM ended the request: "
                                             f"{completion.finish_reason}")
                output.finish()
                stop = completion.stop_reason if isinstance(completion.stop_reason, str) else None
                text = cut_at_stop_string(output.text, stop)
                ended = time.perf_counter()
                first_s = first_s or ended
                generation = Generation(
                    prompt_tokens=len(plan.prompt_ids), tokens=tuple(output.tokens), text=text,
                    finish_reason=completion.finish_reason, prefill_s=first_s - started,
                    decode_s=ended - first_s,
                    steps=_steps_of(completion.spec_decode_metrics, len(output.tokens)),
                    calls=output.parse.calls(len(text)),
                    cached_tokens=delivered.num_cached_tokens or 0)
                yield StepEvent(tokens, deltas.finish(text), None, generation,
                                calls=output.parse.spans)
        finally:
            self._active -= 1
            metrics.record_queue(self._active, 0)


def _steps_of(spec: Any, tokens: int) -> tuple[StepStats, ...]:
    """The request's decoding steps after its first token, from vLLM's per-request
    speculative-decoding metrics (drafted and accepted tokens per verification); the tokens
    they do not account for came one per step without drafts."""
    steps: list[StepStats] = []
    if spec is not None:
        for drafted, accepted in zip(spec.per_step_drafted, spec.per_step_accepted):
            steps.append(StepStats(drafted, accepted, accepted + 1, 0.0, 0.0, 0.0, {}))
    plain = max(0, tokens - 1 - sum(step.emitted for step in steps))
    steps.extend(StepStats(0, 0, 1, 0.0, 0.0, 0.0, {}) for _ in range(plain))
    return tuple(steps)
