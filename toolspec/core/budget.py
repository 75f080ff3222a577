"""How many draft nodes to verify per step: a fixed cap, or the tree that pays most on this
hardware.

Verifying k tokens costs ``cost(k)`` forward-steps (measured: ``toolspec bench cost-curve``). A
step emits 1 + (expected accepted) tokens, where a node is accepted with the product of its and
its ancestors' acceptance probabilities. ``CostAwareBudget`` keeps the prefix-closed set of nodes
whose expected tokens most exceed what their verification time would earn at the rate decoding
achieves; acceptance probabilities are the drafters' priors, calibrated per draft source by what
the model actually accepted so far.
"""

from __future__ import annotations

import bisect
import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Protocol

from toolspec.core.draft_tree import ROOT, DraftTree


class DraftBudget(Protocol):
    max_nodes: int  # how many nodes to ask the drafter for
    calibration: AcceptanceCalibration  # acceptance per draft source, learned online

    def select_batch(self, trees: Sequence[DraftTree], other_rows: int = 0) -> list[DraftTree]:
        """The part of each tree to verify when all of them share one forward, which also
        runs ``other_rows`` rows of other work (prompt chunks)."""

    def observe_batch(self, verified: Sequence[VerifiedTree], other_rows: int = 0) -> None:
        """Learn from the trees one forward verified together beside ``other_rows`` rows of
        other work, and their accepted nodes (a tree that ``rides_on_prefill`` was verified
        in its prompt's forward, not in a decoding step of its own). Mutates: the
        statistics."""


class VerifiedTree(Protocol):
    tree: DraftTree
    accepted: tuple[int, ...]
    rides_on_prefill: bool


ROOT_SOURCE = "root"  # the parent source of a top-level node
CalibrationKey = tuple[str, int, str]  # source, prior band, parent's source


@dataclass
class AcceptanceCalibration:
    """Accepted nodes / the drafter's expected accepted nodes, smoothed, per kind of node.

    A node's kind is its source, its prior's range, and its parent's source (``"root"`` at
    the top): the first token a source adds after a choice it did not see is far less certain
    than the tokens that follow it, and how certain depends on what came before (a call's
    close after a value copied from the conversation, say, or after a fallback's guess). Only
    nodes whose parent was accepted count (the others were never put to the test).
    """

    smoothing: float = 2.0
    accepted: dict[CalibrationKey, float] = field(default_factory=dict)
    expected: dict[CalibrationKey, float] = field(default_factory=dict)

    @staticmethod
    def key(tree: DraftTree, node: int) -> CalibrationKey:
        prior, parent, source = tree.priors[node], tree.parents[node], tree.sources[node]
        band = 3 if prior >= 0.99 else 2 if prior >= 0.5 else 1 if prior >= 0.1 else 0
        return source, band, ROOT_SOURCE if parent == ROOT else tree.sources[parent]

    def probabilities(self, tree: DraftTree) -> list[float]:
        """Each node's calibrated probability of acceptance given its parent's."""
        result = []
        for node, prior in enumerate(tree.priors):
            key = self.key(tree, node)
            ratio = (self.accepted.get(key, 0.0) + self.smoothing) / (
                self.expected.get(key, 0.0) + self.smoothing)
            result.append(min(0.995, prior * ratio))
        return result

    def observe(self, tree: DraftTree, accepted: Sequence[int]) -> None:
        on_path = {ROOT, *accepted}
        for node, parent in enumerate(tree.parents):
            if parent in on_path:
                key = self.key(tree, node)
                self.expected[key] = self.expected.get(key, 0.0) + tree.priors[node]
                self.accepted[key] = self.accepted.get(key, 0.0) + (node in on_path)

    def reach_probabilities(self, tree: DraftTree) -> list[float]:
        """Calibrated probability that each node is accepted (it and all its ancestors)."""
        reach: list[float] = []
        for parent, probability in zip(tree.parents, self.probabilities(tree)):
            reach.append(probability * (1.0 if parent == ROOT else reach[parent]))
        return reach

    def rates(self) -> dict[str, float]:
        """Accepted / expected per source (all kinds of its nodes together)."""
        accepted: dict[str, float] = {}
        expected: dict[str, float] = {}
        for (source, _, _), value in self.expected.items():
            expected[source] = expected.get(source, 0.0) + value
        for (source, _, _), value in self.accepted.items():
            accepted[source] = accepted.get(source, 0.0) + value
        return {s: accepted.get(s, 0.0) / e for s, e in expected.items() if e}


def ranked_by_reach(reach: Sequence[float]) -> list[int]:
    """Nodes, likeliest first. Reach never grows along a path and ties go to the lower index
    (parents come first), so every prefix of this ranking is a connected subtree."""
    return sorted(range(len(reach)), key=lambda node: (-reach[node], node))


@dataclass
class FixedBudget:
    """The ``max_nodes`` nodes of every tree most likely to be accepted (calibrated reach)."""

    max_nodes: int
    calibration: AcceptanceCalibration = field(default_factory=AcceptanceCalibration)

    def select_batch(self, trees: Sequence[DraftTree], other_rows: int = 0) -> list[DraftTree]:
        return [self._select(tree) for tree in trees]

    def _select(self, tree: DraftTree) -> DraftTree:
        if len(tree) <= self.max_nodes:
            return tree
        ranked = ranked_by_reach(self.calibration.reach_probabilities(tree))
        return tree.subtree(sorted(ranked[: self.max_nodes]))

    def observe_batch(self, verified: Sequence[VerifiedTree], other_rows: int = 0) -> None:
        for entry in verified:
            self.calibration.observe(entry.tree, entry.accepted)


class CostCurveFileError(ValueError):
    """A file read as a cost curve holds none."""


@dataclass(frozen=True)
class CostModel:
    """Relative cost of one verification forward over k tokens (root included); cost(1) = 1."""

    sizes: tuple[int, ...]
    relative: tuple[float, ...]

    def __post_init__(self) -> None:
        if not self.sizes or self.sizes[0] != 1 or list(self.sizes) != sorted(set(self.sizes)):
            raise ValueError("cost sizes must be increasing and start at k = 1")

    @classmethod
    def from_timings(cls, timings: Mapping[int, float]) -> CostModel:
        sizes = tuple(sorted(timings))
        return cls(sizes, tuple(timings[k] / timings[sizes[0]] for k in sizes))

    @classmethod
    def linear(cls, per_token: float, up_to: int = 256) -> CostModel:
        """cost(k) = 1 + per_token * (k - 1): a simple model for tests and first guesses."""
        return cls((1, up_to), (1.0, 1.0 + per_token * (up_to - 1)))

    @classmethod
    def load(cls, path: Path) -> CostModel:
        """From a ``cost_curve.json`` (``toolspec bench cost-curve --out``, or the cache) or a
        bench run's ``results.json`` (the curve its budget sized trees to)."""
        data = json.loads(Path(path).read_text())
        curve = data.get("seconds") or data.get("cost_curve")
        if not isinstance(curve, dict) or not curve:
            raise CostCurveFileError(
                f"{path}: holds no cost curve (neither 'seconds' per size, as `toolspec bench "
                f"cost-curve --out` writes, nor the 'cost_curve' a bench run with an auto "
                f"budget records)")
        return cls.from_timings({int(k): float(v) for k, v in curve.items()})

    def cost(self, k: int) -> float:
        """Piecewise-linear in k; past the last measured size, extrapolated with the last slope."""
        index = bisect.bisect_left(self.sizes, k)
        if index < len(self.sizes) and self.sizes[index] == k:
            return self.relative[index]
        if index == len(self.sizes):
            if len(self.sizes) == 1:
                return self.relative[0]
            index -= 1
        low, high = index - 1, index
        span = self.sizes[high] - self.sizes[low]
        slope = (self.relative[high] - self.relative[low]) / span
        return self.relative[low] + slope * (k - self.sizes[low])


@dataclass
class CostAwareBudget:
    """Verifies the subtree whose expected tokens most exceed what its cost would earn at the
    rate decoding achieves: ``1 + sum(reach) - rate * cost(k)``.

    Why not the subtree with the most expected tokens per unit of cost, step by step: that
    ratio grows a poor step's tree on nodes worth less than an average step earns for the
    same time, and stops a good step's tree short of nodes worth more. Decoding as a whole is
    fastest when every node is kept exactly when its reach beats ``rate`` times its marginal
    cost, where ``rate`` is the tokens per unit of cost decoding achieves (Dinkelbach's
    method for ratio objectives), here learned as decoding goes: decode steps' tokens per unit
    of cost, exponentially forgotten with ``memory`` per step, and starting from
    ``prior_rate`` worth ``prior_weight`` units of cost. A tree riding on the prompt's forward
    is chosen by the same rule (its rows cost about what the curve says rows cost), but does
    not count towards the rate: its tokens come at prefill's price, not a step's.

    A batch (``select_batch``: B sequences' trees in one forward) is one objective: the
    forward costs ``cost(B + nodes)`` and earns every sequence's tokens, so nodes of all trees
    compete for it, each kept when its reach beats the batch's rate times its marginal cost
    at the batch's size. The rate is learned per batch size (powers of two): eight sequences
    earn eight tokens from a forward that costs little more than one, so a node must be far
    likelier to pay there — speculation pays less under load, and this is how much less.

    Prompt chunks in the same forward (``other_rows``) move the trees up the curve: their rows
    cost ``cost(other + rows) - cost(other)``, which past the curve's flat start is a full row's
    price each — on a machine where rows are dear, a forward already busy with prompts makes
    speculative rows dear too, and trees shrink while prompts wait.
    """

    cost: CostModel
    max_nodes: int = 64
    calibration: AcceptanceCalibration = field(default_factory=AcceptanceCalibration)
    prior_rate: float = 2.0
    prior_weight: float = 10.0
    memory: float = 0.995
    _tokens: dict[int, float] = field(default_factory=dict, init=False, repr=False)
    _spent: dict[int, float] = field(default_factory=dict, init=False, repr=False)

    @property
    def rate(self) -> float:
        """Tokens per unit of verification cost that one sequence's steps achieve."""
        return self.rate_at(1)

    def rate_at(self, sequences: int) -> float:
        """Tokens per unit of cost that forwards of ``sequences`` decoding sequences achieve
        (smoothed; the prior: ``prior_rate`` tokens per sequence at ``cost(sequences)``)."""
        bucket = _size_bucket(sequences)
        prior = self.prior_rate * bucket / self.cost.cost(bucket)
        return (self._tokens.get(bucket, 0.0) + prior * self.prior_weight) / (
            self._spent.get(bucket, 0.0) + self.prior_weight)

    def select_batch(self, trees: Sequence[DraftTree], other_rows: int = 0) -> list[DraftTree]:
        if not any(len(tree) for tree in trees):
            return list(trees)
        rate = self.rate_at(len(trees))
        reaches = [self.calibration.reach_probabilities(tree) for tree in trees]
        # Every tree's nodes, likeliest first; each tree's own order stays prefix-closed.
        ranked = sorted(((-reach[node], index, node)
                         for index, reach in enumerate(reaches)
                         for node in ranked_by_reach(reach)[: self.max_nodes]))
        base = len(trees)  # every sequence's root
        best_count, expected = 0, float(base)
        best_gain = expected - rate * self._cost(base, other_rows)
        for count, (negative_reach, _, _) in enumerate(ranked, start=1):
            expected -= negative_reach
            gain = expected - rate * self._cost(base + count, other_rows)
            if gain > best_gain:
                best_count, best_gain = count, gain
        kept: list[list[int]] = [[] for _ in trees]
        for _, index, node in ranked[:best_count]:
            kept[index].append(node)
        return [tree.subtree(sorted(nodes)) for tree, nodes in zip(trees, kept)]

    def observe_batch(self, verified: Sequence[VerifiedTree], other_rows: int = 0) -> None:
        for entry in verified:
            self.calibration.observe(entry.tree, entry.accepted)
        decoding = [entry for entry in verified if not entry.rides_on_prefill]
        if decoding:
            self._learn_rate(len(decoding), sum(len(e.accepted) + 1 for e in decoding),
                             self._cost(sum(len(e.tree) + 1 for e in decoding), other_rows))

    def _cost(self, rows: int, other_rows: int) -> float:
        """What ``rows`` rows of trees add to a forward that runs ``other_rows`` besides (alone:
        the curve's cost of ``rows``)."""
        if not other_rows:
            return self.cost.cost(rows)
        return self.cost.cost(other_rows + rows) - self.cost.cost(other_rows)

    def _learn_rate(self, sequences: int, tokens: float, spent: float) -> None:
        bucket = _size_bucket(sequences)
        self._tokens[bucket] = self._tokens.get(bucket, 0.0) * self.memory + tokens
        self._spent[bucket] = self._spent.get(bucket, 0.0) * self.memory + spent


def _size_bucket(sequences: int) -> int:
    """The power of two at or above ``sequences``: batch sizes whose rates are learned
    together."""
    return 1 << max(0, sequences - 1).bit_length()


# A forward's rows: the fewest whose cost per row is within this much of the cheapest per-row
# cost the curve shows (``rows_per_step``).
ROW_COST_SLACK = 1.1


def rows_per_step(cost: CostModel, block_tokens: int, slack: float = ROW_COST_SLACK) -> int:
    """How many rows a forward runs at most (whole prompt blocks, at least one): the fewest at
    which a row costs within ``slack`` of the cheapest per-row cost on the measured curve — vLLM's
    ``max_num_batched_tokens``, chosen from this machine's curve. More rows would barely make
    prompts cheaper to compute, and every decoding request beside them waits for the whole
    forward; fewer would make prompts dearer and queue them (prompts are most of the work)."""
    measured = [k for k in cost.sizes if k >= block_tokens] or [block_tokens]
    cheapest = min(cost.cost(k) / k for k in measured)
    for rows in range(block_tokens, measured[-1] + block_tokens, block_tokens):
        if cost.cost(rows) / rows <= slack * cheapest:
            return rows
    return measured[-1] // block_tokens * block_tokens or block_tokens
