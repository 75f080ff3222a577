"""A model replica: one loaded engine serving many requests at once.

``ModelReplica`` is a plain class (tests drive it with a scripted engine, no Ray);
``ModelServer`` is what the builder deploys: it builds the engine its settings name (the
project's own or vLLM's; once, or again when ``user_config`` names another model or engine) and
the library view from the retrieval actor's handle.
"""

from __future__ import annotations

import asyncio
import logging
import os
import socket
import time
from collections.abc import AsyncIterator, Callable, Mapping
from typing import Any

from deployments.library.cache import LibraryCache, ShardedLibraryRemote
from deployments.library.decode_lookups import DecodeLookups
from deployments.messages import (
    ChatRequest,
    ContextLengthError,
    ReplicaEvent,
    StreamEnd,
    StreamError,
    StreamStart,
    TextStep,
)
from deployments.ops import metrics
from deployments.ops.tracing import record_span, record_step, tracer
from deployments.replica.engine import ChatEngine, EngineSettings
from deployments.replica.toolspec_engine import ToolSpecChatEngine
from toolspec.core.engine import Generation
from toolspec.core.generation import StepStats

logger = logging.getLogger(f"ray.serve.{__name__}")  # into the replica's Serve log
EngineFactory = Callable[[EngineSettings], ChatEngine]



def build_chat_engine(settings: EngineSettings) -> ChatEngine:
    """The engine ``settings.engine`` names (vLLM is imported only when it is the one)."""
    if settings.engine == "vllm":
        from deployments.replica.vllm_engine import VLLMChatEngine

        return VLLMChatEngine(settings)
    return ToolSpecChatEngine(settings)

class ModelReplica:
    """Runs requests on ``engine`` (which batches them); fills ``library`` (if any) ahead of
    use — at request start and as the output reveals its calls — and records finished calls
    in it. ``reload`` swaps the engine between requests, never under one. Mutates: the
    library view; the engine (``reload``)."""

    def __init__(self, engine: ChatEngine, library: LibraryCache | None = None,
                 name: str | None = None) -> None:
        self.engine = engine
        self.library = library
        self.name = name or f"{socket.gethostname()}:{os.getpid()}"
        self.served = 0
        self._in_flight = 0  # requests holding the engine (opened, not yet ended)
        self._open = asyncio.Event()  # cleared while ``reload`` swaps the engine
        self._open.set()
        self._idle = asyncio.Event()  # set whenever nothing is in flight
        self._idle.set()

    async def reload(self, build: Callable[[], ChatEngine], drain_timeout_s: float) -> None:
        """Replace the engine by ``build()``'s: new requests wait while the old engine finishes
        the ones it holds (at most ``drain_timeout_s``; past it they end with an error), then
        it is closed — its worker ranks or processes gone, so the new one can take their
        place — and the new one is built (in a thread: loading takes seconds to minutes).
        No request ever sees two engines, and the new engine's caches hold only what it
        computed. If the build fails, the old engine is gone: the replica turns unhealthy and
        Serve replaces it. Mutates: the engine."""
        self._open.clear()
        try:
            try:
                await asyncio.wait_for(self._idle.wait(), drain_timeout_s)
            except TimeoutError:
                logger.warning("%d requests still running after %.0f s; reloading under them",
                               self._in_flight, drain_timeout_s)
            old = self.engine
            self.engine = reloading = _Reloading(old.describe())
            await asyncio.to_thread(old.close)
            try:
                self.engine = await asyncio.to_thread(build)
            except Exception as error:
                reloading.failed = error
                raise
        finally:
            self._open.set()

    async def generate(self, request: ChatRequest) -> AsyncIterator[ReplicaEvent]:
        """``StreamStart``, a ``TextStep`` per decoding step, then ``StreamEnd`` — or a
        ``StreamError`` (a prompt too long for this model, the deadline passed, a failure;
        the failure's details go to the log under the request id, not to the client)."""
        # Not a current span: the context would have to cross the generator's yields.
        span = tracer.start_span("toolspec.generate", attributes={
            "toolspec.request_id": request.request_id, "toolspec.replica": self.name})
        try:
            async for event in self._generate(request, span):
                yield event
        except ContextLengthError as error:
            yield StreamError("context_length_exceeded", str(error))
        except DeadlineExceededError:
            logger.warning("request %s passed its deadline; ended", request.request_id)
            yield StreamError("deadline_exceeded", "the request passed its deadline")
        except Exception as error:  # the request's own failure: this replica serves on
            logger.exception("request %s failed", request.request_id)
            yield StreamError("internal_error", type(error).__name__)
        finally:
            span.end()

    async def _generate(self, request: ChatRequest, span: Any) -> AsyncIterator[ReplicaEvent]:
        _check_deadline(request)
        await self._open.wait()
        self._in_flight += 1
        self._idle.clear()
        try:
            async for event in self._run(request, span, self.engine):
                yield event
        finally:
            self._in_flight -= 1
            if not self._in_flight:
                self._idle.set()

    async def _run(self, request: ChatRequest, span: Any, engine: ChatEngine
                   ) -> AsyncIterator[ReplicaEvent]:
        if self.library is not None:
            fetch = self.library.prefetch(request)
            if fetch is not None and engine.library_wait_s > 0:
                await asyncio.wait([fetch], timeout=engine.library_wait_s)
        chat = engine.open(request, self.library.local if self.library else None)
        span.set_attributes({"toolspec.prompt_tokens": chat.prompt_tokens,
                             "toolspec.constrained": chat.constrained})
        yield StreamStart(chat.call_format.name, chat.prompt_tokens, self.name,
                          chat.constrained)
        lookups = None
        if self.library is not None and request.parses_calls:
            lookups = DecodeLookups(self.library, request, chat.call_format.arguments_key)
        first_step_s = None
        recorded = 0  # steps whose statistics the stream carried (the rest come at the end)
        async for step in chat.steps:
            _check_deadline(request)  # leaving the loop closes the steps: the slot is freed
            if not step.tokens and step.generation is None:
                continue  # a chunk of the prompt's prefill
            now = time.perf_counter()
            if first_step_s is None:
                first_step_s = now
            if step.stats is not None:
                record_step(step.stats, now, span)
                _record_step_metrics(step.stats)
                recorded += 1
            if lookups is not None:
                lookups.observe(step.text, step.calls)  # starts a lookup at most; never waits
            if step.text or step.calls or step.generation is None:
                yield TextStep(step.text, len(step.tokens), step.calls)
            if step.generation is not None:
                generation = step.generation
                for stats in generation.steps[recorded:]:
                    _record_step_metrics(stats)
                if first_step_s is not None:
                    record_span("toolspec.prefill", first_step_s - generation.prefill_s,
                                generation.prefill_s, span)
                self.served += 1
                if self.library is not None and request.parses_calls:
                    self.library.remember(request, generation.calls)
                metrics.record_prompt(generation.prompt_tokens, generation.cached_tokens)
                span.set_attributes({"toolspec.completion_tokens": len(generation.tokens),
                                     "toolspec.cached_tokens": generation.cached_tokens,
                                     "toolspec.steps": len(generation.steps)})
                yield _end(generation)

    async def describe(self) -> dict[str, Any]:
        """What this replica serves and how it is: the loaded model, its requests, and
        whether the retrieval actor answers (``disabled``: drafting without a library)."""
        library = "disabled"
        if self.library is not None:
            library = "reachable" if await self.library.ping() else "unreachable"
        return {**self.engine.describe(), "replica": self.name, "served": self.served,
                "library": library}

    def shutdown(self) -> None:
        self.engine.close()
        if self.library is not None:
            self.library.close()


class DeadlineExceededError(TimeoutError):
    """The request ran past ``ChatRequest.deadline``."""


def _check_deadline(request: ChatRequest) -> None:
    if request.deadline is not None and time.time() > request.deadline:
        raise DeadlineExceededError(request.request_id)


def _record_step_metrics(stats: StepStats) -> None:
    metrics.record_step(stats.emitted, stats.nodes, stats.accepted_by_source, stats.draft_s,
                        stats.verify_s)


def _end(generation: Generation) -> StreamEnd:
    return StreamEnd(
        finish_reason=generation.finish_reason,
        completion_tokens=len(generation.tokens),
        steps=len(generation.verifications),
        accepted_by_source=dict(generation.accepted_by_source()),
        prefill_s=generation.prefill_s,
        decode_s=generation.decode_s,
        mat=generation.mat,
        cached_tokens=generation.cached_tokens,
        decode_rows=generation.decode_rows,
    )


class ModelServer:
    """The Serve deployment class of model replicas.

    ``settings``: the ``EngineSettings`` fields; ``user_config`` (``reconfigure``) may change
    them later — another engine, model, dtype or weight packing (any vLLM setting) reloads the
    engine once the requests in flight are done (at most ``drain_timeout_s``), the rest applies
    in place. ``engine_factory`` builds the engine (default: the one ``settings.engine``
    names; tests pass a scripted one). ``library``: the retrieval actors' handles (one per part
    of the shards, in order), or None to draft without retrieval.
    """

    def __init__(self, settings: Mapping[str, Any], library: Any = None,
                 engine_factory: EngineFactory | None = None,
                 drain_timeout_s: float = 300.0) -> None:
        self.factory: EngineFactory = engine_factory or build_chat_engine
        self.settings = EngineSettings.model_validate(settings)
        self.drain_timeout_s = drain_timeout_s
        if library is not None and not isinstance(library, (list, tuple)):
            library = [library]
        cache = LibraryCache(ShardedLibraryRemote(library)) if library else None
        self.replica = ModelReplica(self.factory(self.settings), cache)

    async def reconfigure(self, user_config: Mapping[str, Any]) -> None:
        """Apply ``user_config`` (``EngineSettings`` fields, checked as the deployment's config
        is: a bad value fails the update, naming the field, and the engine serves on
        unchanged). Mutates: the engine, if needed."""
        settings = self.settings.updated(user_config)
        if settings == self.settings:
            return
        if _loaded_as(settings) != _loaded_as(self.settings):
            logger.info("reloading the engine for %s", settings.fields())
            await self.replica.reload(lambda: self.factory(settings), self.drain_timeout_s)
        else:
            self.replica.engine.apply(settings)
        self.settings = settings

    async def generate(self, request: ChatRequest) -> AsyncIterator[ReplicaEvent]:
        async for event in self.replica.generate(request):
            yield event

    async def describe(self) -> dict[str, Any]:
        return await self.replica.describe()

    def check_health(self) -> None:
        """Serve's periodic check: raises (and Serve replaces this replica) when the engine
        cannot serve any more, e.g. a worker rank of its model died."""
        self.replica.engine.check_health()

    def __del__(self) -> None:
        replica = getattr(self, "replica", None)
        if replica is not None:
            replica.shutdown()


class _Reloading:
    """The engine while ``ModelReplica.reload`` builds the next one: no request reaches it
    (they wait), it reports what was loaded, and it turns unhealthy if the build fails."""

    library_wait_s = 0.0

    def __init__(self, description: Mapping[str, Any]) -> None:
        self.description = {**description, "active_requests": 0, "reloading": True}
        self.failed: Exception | None = None

    def open(self, request: ChatRequest, library: Any) -> Any:
        raise RuntimeError("the engine is reloading")  # never reached: requests wait

    def apply(self, settings: EngineSettings) -> None:
        pass

    def describe(self) -> dict[str, Any]:
        return dict(self.description)

    def check_health(self) -> None:
        if self.failed is not None:
            raise RuntimeError(f"the engine failed to reload: {self.failed!r}")

    def close(self) -> None:
        pass


def _loaded_as(settings: EngineSettings) -> tuple[Any, ...]:
    """The settings whose change reloads the engine (the others apply in place). vLLM takes
    all of its settings when it starts."""
    if settings.engine == "vllm":
        return (settings,)
    return (settings.engine, settings.model, settings.dtype, settings.prepack_linear,
            settings.tensor_parallel_size, settings.exact_bf16)
