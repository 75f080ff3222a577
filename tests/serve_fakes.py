"""A scripted chat engine and an in-process model client: the served system without a model."""

from __future__ import annotations

import threading
import time
from collections.abc import AsyncIterator, Callable, Iterator, Sequence
from typing import Any

from deployments.messages import ChatRequest, ReplicaEvent
from deployments.replica.engine import EngineSettings, OpenedRequest
from deployments.replica.model_replica import ModelReplica
from deployments.replica.scheduler import BatchScheduler
from toolspec.calls.formats import get_format
from toolspec.calls.output import OutputParse
from toolspec.core.engine import Generation, StepEvent, StepOutcome, StepResult, StepStats
from toolspec.library import CallLibrary

Script = Callable[[ChatRequest], Sequence[str]]


def fixed(*pieces: str) -> Script:
    return lambda request: pieces


HELLO = fixed("Hello.")


class ScriptedChatEngine:
    """Answers every request with the text pieces ``script`` gives, one piece per step (a
    piece stands for however many tokens a step accepted: one "token" per character).
    ``finish`` is the engine's finish reason; ``step_s`` a pause per step (on the worker
    thread, like a forward pass). Its requests are stepped together by a ``BatchScheduler``,
    as the project's engine steps them. Records the requests it was given in ``requests``."""

    library_wait_s = 0.0

    def __init__(self, settings: EngineSettings | None = None, script: Script = HELLO,
                 call_format: str = "hermes", finish: str = "stop", step_s: float = 0.0) -> None:
        self.settings = settings
        self.script = script
        self.call_format = call_format
        self.finish = finish
        self.step_s = step_s
        self.requests: list[ChatRequest] = []
        self.libraries: list[CallLibrary | None] = []
        self.scheduler = BatchScheduler(self.step)
        self.closed = False

    def apply(self, settings: EngineSettings) -> None:
        self.settings = settings

    def describe(self) -> dict[str, Any]:
        return {"model": "toy-model", "dtype": "float32", "context_tokens": 4096,
                "engine": "scripted", "active_requests": self.scheduler.active}

    def check_health(self) -> None:
        pass  # nothing beyond this process to lose

    def close(self) -> None:
        self.closed = True
        self.scheduler.shutdown()

    def open(self, request: ChatRequest, library: CallLibrary | None) -> OpenedRequest:
        self.requests.append(request)
        self.libraries.append(library)
        job = ScriptedJob(self._steps(list(self.script(request))))
        return OpenedRequest(get_format(self.call_format), 11, self.scheduler.run(job),
                             constrained=request.constrained)

    def step(self, jobs: Sequence[ScriptedJob]) -> StepResult:
        """One "forward" (``step_s``) for every job: each advances by one piece."""
        time.sleep(self.step_s)
        return StepResult([job.advance() for job in jobs])

    def _steps(self, pieces: list[str]) -> Iterator[StepEvent]:
        tokens: list[int] = []
        steps: list[StepStats] = []
        parse = OutputParse(get_format(self.call_format))  # the request's one parse, as a job's
        for number, piece in enumerate(pieces):
            ids = tuple(ord(char) for char in piece)
            tokens.extend(ids)
            parse.feed(piece)
            stats = None
            if number:
                # Timed as a real step is (the draft and the forward it stands for: step_s,
                # at least a millisecond), so its timings reach the metrics in any test order.
                stats = StepStats(len(ids) + 2, len(ids) - 1, len(ids), 0.0005,
                                  max(self.step_s, 0.001), 0.0, {"schema": len(ids) - 1})
                steps.append(stats)
            generation = None
            if number == len(pieces) - 1:
                generation = Generation(11, tuple(tokens), "".join(pieces), self.finish, 0.01,
                                        0.02, tuple(steps), calls=parse.calls())
            yield StepEvent(ids, piece, stats, generation, calls=parse.spans)


class ScriptedJob:
    """A scripted request as the scheduler sees it: one event per step. Mutates: ``done``."""

    def __init__(self, events: Iterator[StepEvent]) -> None:
        self.events = events
        self.done = False
        self.closed = False

    def advance(self) -> StepOutcome:
        try:
            event = next(self.events)
        except Exception as error:  # noqa: BLE001 - the request's own failure
            self.close()
            return StepOutcome(error=error)
        if event.generation is not None:
            self.done = True
        return StepOutcome(event)

    def close(self) -> None:
        self.done = self.closed = True
        close = getattr(self.events, "close", None)
        if close is not None:
            close()


def scripted_factory(script: Script, call_format: str = "hermes", step_s: float = 0.0
                     ) -> Callable[[EngineSettings], ScriptedChatEngine]:
    """An ``engine_factory`` for ``build_app`` (picklable when this module goes by value)."""
    return lambda settings: ScriptedChatEngine(settings, script, call_format, step_s=step_s)


def by_message(scripts: dict[str, Sequence[str]], default: Sequence[str]) -> Script:
    """A script answering with ``scripts[word]`` when the last message holds ``word``."""
    def script(request: ChatRequest) -> Sequence[str]:
        text = str(request.messages[-1].get("content", ""))
        return next((pieces for word, pieces in scripts.items() if word in text), default)
    return script


class FailingChatEngine(ScriptedChatEngine):
    """A ``ScriptedChatEngine`` whose step after the first raises, for requests whose last
    message holds "boom" (a fault inside the decode loop)."""

    def _steps(self, pieces: list[str]) -> Iterator[StepEvent]:
        boom = "boom" in str(self.requests[-1].messages[-1].get("content", ""))
        for number, event in enumerate(super()._steps(pieces)):
            if boom and number == 1:
                raise RuntimeError("secret detail: /etc/passwd line 3")
            yield event


def failing_factory(script: Script, step_s: float = 0.0
                    ) -> Callable[[EngineSettings], ScriptedChatEngine]:
    return lambda settings: FailingChatEngine(settings, script, step_s=step_s)


class LocalModelClient:
    """``ModelClient`` calling a ``ModelReplica`` in process (what the Serve handle does)."""

    def __init__(self, replica: ModelReplica) -> None:
        self.replica = replica

    async def stream(self, request: ChatRequest) -> AsyncIterator[ReplicaEvent]:
        async for event in self.replica.generate(request):
            yield event

    async def describe(self) -> dict[str, Any]:
        return await self.replica.describe()

    async def deployments(self) -> dict[str, Any] | None:
        return None  # not under Serve


class ProbingChatEngine(ScriptedChatEngine):
    """A ``ScriptedChatEngine`` answering ``pieces`` that, before each step, records what the
    replica's library view offers to continue ``probe_call`` for the request's tenant — what
    a drafter could draft at that step — in ``seen`` (one sorted list of continuations per
    step). With ``gated``, step i waits until ``gates[i]`` is set (the test paces decoding)."""

    def __init__(self, pieces: Sequence[str], probe_call: str, gated: bool = False) -> None:
        super().__init__(script=fixed(*pieces))
        self.probe_call = probe_call
        self.gates = [threading.Event() for _ in pieces] if gated else []
        self.seen: list[list[str]] = []

    def _steps(self, pieces: list[str]) -> Iterator[StepEvent]:
        request, library = self.requests[-1], self.libraries[-1]
        for number, event in enumerate(super()._steps(pieces)):
            if self.gates and not self.gates[number].wait(timeout=60):
                raise TimeoutError(f"step {number} was never released")
            found = library.lookup_text(request.tenant, self.probe_call) if library else []
            self.seen.append(sorted(match.continuation for match in found))
            yield event
