"""One request's decoding as a job: each step it hands rows to a forward and takes its logits.

A ``DecodeJob`` does everything for its request except the forward: it says what rows the
next forward must run for it (a chunk of its prompt, or its root and a draft tree), and takes
the logits back — the acceptance walk, the KV commit, the stop checks, the drafter's
``observe``. The forward is the engine's (``Engine.step``): one job alone, or the rows of many
jobs in one ragged forward; the job cannot tell the difference.

Mutates: its own cache, drafter and chooser; nothing shared but what its drafter shares.
"""

from __future__ import annotations

import logging
import time
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

import torch
from transformers import DynamicCache

from toolspec.calls.output import RequestOutput
from toolspec.core.draft_tree import DraftTree
from toolspec.core.drafter import Drafter, DraftRequest
from toolspec.core.forward import SequenceRows, TargetForward
from toolspec.core.generation import (
    Generation,
    GenerationParams,
    KVPrefix,
    PrefixMismatchError,
    StepEvent,
    StepObserver,
    StepStats,
    Verification,
)
from toolspec.core.sampling import TokenChooser
from toolspec.core.stopping import StopDecision, StopScanner, cut_at_stop_string
from toolspec.core.text_stream import TextDeltas
from toolspec.core.verify import AcceptedPath, walk_tree

if TYPE_CHECKING:
    from transformers.tokenization_utils_base import PreTrainedTokenizerBase

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class TreeAcceptance:
    """What the model accepted of a tree it verified, for the budget to learn from
    (``toolspec.core.budget.VerifiedTree``): the tree, the accepted nodes, and whether the
    tree rode on the prompt's forward (``rides_on_prefill``: verified in the prefill, not in a
    decoding step of its own, so it cost the step no forward). Observers see another view of
    the same walk, ``toolspec.core.generation.Verification``."""

    tree: DraftTree
    accepted: tuple[int, ...]
    rides_on_prefill: bool


class DecodeJob:
    """The decoding of one prompt. Each step: ``propose`` (unless it runs a prompt chunk),
    ``rows`` → a forward → ``advance``; ``done`` once the last event is out. ``close`` ends it
    early (the drafter is stopped either way). The output is read once, by ``output`` (the
    request's ``RequestOutput``, shared with its drafter through ``request.output``).
    ``prefix``: a cache already holding the prompt's first tokens (the simulator's replay);
    a prefix cache's blocks come in through ``take_cached``."""

    def __init__(self, model: TargetForward, tokenizer: PreTrainedTokenizerBase,
                 stop_token_ids: frozenset[int], drafter: Drafter, params: GenerationParams,
                 request: DraftRequest, max_nodes: int, draft_at_prefill: bool = True,
                 prefix: KVPrefix | None = None, chooser: TokenChooser | None = None,
                 observers: Sequence[StepObserver] = ()) -> None:
        self.model = model
        self.tokenizer = tokenizer
        self.drafter = drafter
        self.params = params
        self.max_nodes = max_nodes
        self.draft_at_prefill = draft_at_prefill
        self.prompt_ids = tuple(request.prompt_ids)
        self.prompt_tokens = len(request.prompt_ids)
        self.tenant = request.tenant
        self.cached_tokens = 0  # prompt tokens whose keys and values came from a prefix cache
        # The engine's bookkeeping for its prefix cache: the prompt's block keys (computed
        # once), and how many leading blocks it has already offered the cache.
        self.block_keys: list[bytes] | None = None
        self.blocks_offered = 0
        # ``chooser``: choices given from elsewhere (the simulator replays a recorded output).
        self.chooser = chooser or params.chooser()
        # Told each verification by the engine, from outside the job (``StepObserver``).
        self.observers = tuple(observers)
        self.output = request.output or RequestOutput(tokenizer, request.call_format)
        self.stop_scanner = StopScanner(stop_token_ids, params.stop, params.max_new_tokens)
        self.deltas = TextDeltas(params.stop)
        self.cache, reused = _start_cache(model, request.prompt_ids, prefix)
        self.started = time.perf_counter()
        self._closed = False
        drafter.start(request)
        self.context = list(request.prompt_ids)
        self.pending = self.context[reused:]  # not yet in the cache; the last roots a tree
        self.steps: list[StepStats] = []
        self.prefill_step: StepStats | None = None
        self.prefill_s = 0.0
        self.done = False
        self._draft_s = 0.0
        self.proposal = DraftTree()  # the drafter's latest tree, before the budget
        self.acceptance: TreeAcceptance | None = None  # the latest step's, where it drafted
        self.verification: Verification | None = None  # the latest step's walk (any tree)
        self._tree: DraftTree | None = None
        self._chunk = 0
        self._drafting = False

    # ---- before the forward -----------------------------------------------------------------

    @property
    def generated(self) -> list[int]:
        """The output's tokens so far (the output's own list: read, never change)."""
        return self.output.tokens

    @property
    def prefilling(self) -> bool:
        return not self.generated

    @property
    def prompt_rows(self) -> int:
        """Rows of the prompt still to run (0 once it is in the cache)."""
        return len(self.pending) if self.prefilling else 0

    @property
    def prompt_position(self) -> int:
        """How many of the prompt's tokens the cache holds."""
        return self.prompt_tokens - self.prompt_rows

    def take_cached(self, tokens: int) -> None:
        """The cache was given the keys and values of the next ``tokens`` prompt tokens (from
        a prefix cache); at least one prompt token must be left to run. Mutates: the pending
        tokens."""
        if not 0 < tokens < self.prompt_rows:
            raise ValueError(f"{tokens} cached prompt tokens must leave some of the "
                             f"{self.prompt_rows} pending prompt rows to run")
        self.pending = self.pending[tokens:]
        self.cached_tokens += tokens

    def propose(self) -> DraftTree:
        """The drafter's tree for the next step (before any budget; empty where it does not
        draft: no room left, or a prompt's forward with ``draft_at_prefill`` off)."""
        clock = time.perf_counter()
        room = self._room()
        self._drafting = room > 0 and (self.draft_at_prefill or not self.prefilling)
        tree = self.drafter.propose(self.context, room) if self._drafting else DraftTree()
        self._draft_s += time.perf_counter() - clock
        self.proposal = tree
        return tree

    def rows(self, tree: DraftTree | None = None, chunk: int | None = None) -> SequenceRows:
        """The next forward's rows: ``chunk`` tokens of the prompt (no logits), or the pending
        tokens and ``tree`` (the part of ``propose``'s tree the budget chose)."""
        if chunk is not None:
            if not 0 < chunk < len(self.pending):
                raise ValueError(f"a prompt chunk of {chunk} rows must leave the root of "
                                 f"{len(self.pending)} pending rows for a later step")
            self._tree, self._chunk, self._drafting = None, chunk, False
            return SequenceRows(self.cache, tuple(self.pending[:chunk]), logits=False,
                                prompt=True)
        self._tree, self._chunk = tree if tree is not None else DraftTree(), 0
        return SequenceRows(self.cache, tuple(self.pending), self._tree,
                            prompt=self.prefilling)

    def _room(self) -> int:
        return min(self.max_nodes, self.params.max_new_tokens - len(self.generated) - 1)

    # ---- after the forward ------------------------------------------------------------------

    def advance(self, logits: torch.Tensor | None, forward_s: float = 0.0
                ) -> tuple[StepEvent, TreeAcceptance | None]:
        """Take the forward's logits for this job's rows: commit a prompt chunk, or walk the
        tree, commit the accepted path and check for the end. Returns the step's event and,
        for a verification, what the budget learns from it."""
        if self._tree is None:  # a prompt chunk: its keys and values are all kept
            self.pending = self.pending[self._chunk:]
            self.acceptance = self.verification = None
            return StepEvent((), "", None), None
        # prompt_forward: this forward ran the prompt's last chunk, and its tokens are the
        # request's first (its time is the prefill's). rides_on_prefill (below) is narrower:
        # prompt rows came before the tree in the forward, so the tree cost no step of its
        # own — not so when the prefix cache held all of the prompt but its last token.
        tree, prompt_forward = self._tree, self.prefilling
        clock = time.perf_counter()
        base_length = self.cache.get_seq_length() - len(self.pending) - len(tree)
        self.chooser.bind(logits)
        path = walk_tree(tree, self.chooser)
        self.model.commit_path(self.cache, base_length + len(self.pending) - 1, path.rows)
        committed = time.perf_counter()
        emitted = [*(tree.tokens[node] for node in path.nodes), path.bonus]
        decision = self.stop_scanner.append(self.output, emitted)
        if decision is not None:
            emitted = emitted[: decision.keep]
        self.verification = Verification(self.pending[-1], tree, tuple(path.rows),
                                         tuple(emitted))
        self.context.extend(emitted)
        rides_on_prefill = len(self.pending) > 1
        self.pending = self.context[-1:]
        self.drafter.observe(emitted)
        stats = _step_stats(tree, path, len(emitted), self._draft_s + time.perf_counter()
                            - committed, forward_s, committed - clock)
        self._draft_s = 0.0
        acceptance = TreeAcceptance(tree, path.nodes, rides_on_prefill) if self._drafting \
            else None
        self.acceptance = acceptance
        if prompt_forward:
            self.prefill_s = time.perf_counter() - self.started
            self.prefill_step = stats if len(tree) else None
        else:
            self.steps.append(stats)
        if decision is None:
            return StepEvent(tuple(emitted), self.deltas.update(self.output.text),
                             None if prompt_forward else stats,
                             calls=self.output.parse.spans), acceptance
        return self._finish(decision, emitted, None if prompt_forward else stats), acceptance

    def _finish(self, decision: StopDecision, emitted: list[int], stats: StepStats | None
                ) -> StepEvent:
        self.done = True
        self.output.finish()
        text = cut_at_stop_string(self.output.text, decision.stop_string)
        generation = Generation(
            prompt_tokens=self.prompt_tokens,
            tokens=tuple(self.generated),
            text=text,
            finish_reason=decision.reason,
            prefill_s=self.prefill_s,
            decode_s=time.perf_counter() - self.started - self.prefill_s,
            steps=tuple(self.steps),
            prefill_step=self.prefill_step,
            calls=self.output.parse.calls(len(text)),
            cached_tokens=self.cached_tokens,
        )
        self.close()
        return StepEvent(tuple(emitted), self.deltas.finish(generation.text), stats, generation,
                         self.output.parse.spans)

    def close(self) -> None:
        """End the job (finished, failed or abandoned): the drafter is stopped, once. A drafter
        that fails to stop is logged, not raised: the job is over either way, and the other
        jobs of its step must not fail with it."""
        if not self._closed:
            self._closed = True
            self.done = True
            try:
                self.drafter.stop()
            except Exception:  # noqa: BLE001 - see above
                logger.exception("a drafter failed to stop")


def _start_cache(model: TargetForward, prompt_ids: Sequence[int], prefix: KVPrefix | None
                 ) -> tuple[DynamicCache, int]:
    if prefix is None:
        return model.new_cache(), 0
    reused = len(prefix.tokens)
    if reused >= len(prompt_ids) or tuple(prompt_ids[:reused]) != prefix.tokens \
            or prefix.cache.get_seq_length() != reused:
        raise PrefixMismatchError(
            f"a KV prefix of {reused} tokens ({prefix.cache.get_seq_length()} cached) must "
            f"be a proper prefix of the {len(prompt_ids)}-token prompt")
    return prefix.cache, reused


def _step_stats(tree: DraftTree, path: AcceptedPath, emitted: int, draft_s: float,
                verify_s: float, commit_s: float) -> StepStats:
    accepted = path.nodes[:emitted]  # a stop may cut the step short
    return StepStats(
        nodes=len(tree),
        accepted=len(accepted),
        emitted=emitted,
        draft_s=draft_s,
        verify_s=verify_s,
        commit_s=commit_s,
        accepted_by_source=Counter(tree.sources[node] for node in accepted),
    )
