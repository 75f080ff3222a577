"""A model replica: one loaded engine serving many requests, all of them in every forward.

``ModelReplica`` is a plain class (tests drive it with a scripted engine, no Ray);
``ModelServer`` is what the builder deploys: it builds the engine from its settings (once, or
again when ``user_config`` names another model) and the library view from the retrieval
actor's handle.
"""

from __future__ import annotations

import logging
import os
import socket
import time
from collections.abc import AsyncIterator, Callable, Mapping
from dataclasses import asdict, replace
from typing import Any

from deployments import metrics
from deployments.chat_engine import ChatEngine, EngineSettings, ToolSpecChatEngine
from deployments.decode_lookups import DecodeLookups
from deployments.library_cache import LibraryCache, ShardedLibraryRemote
from deployments.messages import (
    ChatRequest,
    ContextLengthError,
    ReplicaEvent,
    StreamEnd,
    StreamError,
    StreamStart,
    TextStep,
)
from deployments.scheduler import BatchScheduler
from deployments.tracing import record_span, record_step, tracer
from toolspec.core.engine import Generation

logger = logging.getLogger(f"ray.serve.{__name__}")  # into the replica's Serve log
EngineFactory = Callable[[EngineSettings], ChatEngine]


class ModelReplica:
    """Runs requests on ``engine`` through a ``BatchScheduler``; fills ``library`` (if any)
    ahead of use — at request start and as the output reveals its calls — and records
    finished calls in it. Mutates: the library view; the scheduler's queue."""

    def __init__(self, engine: ChatEngine, library: LibraryCache | None = None,
                 name: str | None = None) -> None:
        self.engine = engine
        self.library = library
        self.name = name or f"{socket.gethostname()}:{os.getpid()}"
        # The engine may be replaced (``ModelServer.reconfigure``): step whichever is current.
        self.scheduler = BatchScheduler(lambda jobs: self.engine.step(jobs))
        self.served = 0

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
        if self.library is not None:
            self.library.prefetch(request)
        chat = self.engine.open(request, self.library.local if self.library else None)
        span.set_attributes({"toolspec.prompt_tokens": chat.prompt_tokens,
                             "toolspec.constrained": chat.constrained})
        yield StreamStart(chat.call_format.name, chat.prompt_tokens, self.name,
                          chat.constrained)
        lookups = None
        if self.library is not None and request.parses_calls:
            lookups = DecodeLookups(self.library, request, chat.call_format.arguments_key)
        first_step_s = None
        async for step in self.scheduler.run(chat.job):
            _check_deadline(request)  # leaving the loop closes the steps: the slot is freed
            if not step.tokens and step.generation is None:
                continue  # a chunk of the prompt's prefill
            now = time.perf_counter()
            if step.stats is None:
                first_step_s = now
            else:
                record_step(step.stats, now, span)
                metrics.record_step(step.stats.emitted, step.stats.nodes,
                                    step.stats.accepted_by_source, step.stats.draft_s,
                                    step.stats.verify_s)
            if lookups is not None:
                lookups.observe(step.text, step.calls)  # starts a lookup at most; never waits
            if step.text or step.calls or step.generation is None:
                yield TextStep(step.text, len(step.tokens), step.calls)
            if step.generation is not None:
                generation = step.generation
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
        return {**self.engine.describe(), "replica": self.name,
                "active_requests": self.scheduler.active, "served": self.served,
                "library": library}

    def shutdown(self) -> None:
        self.scheduler.shutdown()
        if self.library is not None:
            self.library.close()


class DeadlineExceededError(TimeoutError):
    """The request ran past ``ChatRequest.deadline``."""


def _check_deadline(request: ChatRequest) -> None:
    if request.deadline is not None and time.time() > request.deadline:
        raise DeadlineExceededError(request.request_id)


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
    them later — another model, dtype or prepack_linear reloads the engine, the rest applies in
    place.
    ``engine_factory`` builds the engine (tests pass a scripted one). ``library``: the
    retrieval actors' handles (one per part of the shards, in order), or None to draft
    without retrieval.
    """

    def __init__(self, settings: Mapping[str, Any], library: Any = None,
                 engine_factory: EngineFactory | None = None) -> None:
        self.factory: EngineFactory = engine_factory or ToolSpecChatEngine
        self.settings = EngineSettings(**settings)
        if library is not None and not isinstance(library, (list, tuple)):
            library = [library]
        cache = LibraryCache(ShardedLibraryRemote(library)) if library else None
        self.replica = ModelReplica(self.factory(self.settings), cache)

    def reconfigure(self, user_config: Mapping[str, Any]) -> None:
        """Apply ``user_config`` (EngineSettings fields). Mutates: the engine, if needed."""
        settings = replace(self.settings, **dict(user_config))
        if settings == self.settings:
            return
        if _loaded_as(settings) != _loaded_as(self.settings):
            logger.info("reloading the engine for %s", asdict(settings))
            self.replica.engine.close()  # its worker ranks first: a new group replaces them
            self.replica.engine = self.factory(settings)
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
            replica.engine.close()


def _loaded_as(settings: EngineSettings) -> tuple[str, str, bool, int, bool]:
    """The settings whose change reloads the model (the others apply in place)."""
    return (settings.model, settings.dtype, settings.prepack_linear,
            settings.tensor_parallel_size, settings.exact_bf16)
