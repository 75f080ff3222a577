"""DraftTree: the speculative tokens checked by one forward pass of the target model.

A tree hangs below the *root*: the last token the engine has emitted but not yet run through the
model. Node ``i`` holds ``tokens[i]``; its parent is ``parents[i]`` (``ROOT`` = -1 for children of
the root, otherwise an earlier node, so nodes are topologically ordered). ``sources[i]`` names the
drafter that proposed the node, so acceptance can be reported per source.

The forward pass runs over ``[root, node 0, node 1, ...]``; "row" below means an index into that
sequence (row 0 is the root, row ``i + 1`` is node ``i``). Everything the verifier needs — the
attention mask, the position ids, the child lookup used by acceptance — derives from
``parents``. Trees are immutable; building one from token sequences merges shared prefixes.

``priors[i]`` is the drafter's estimate that node ``i`` is accepted given that its parent is
(1.0 when the drafter has no opinion); the engine uses it to size the tree to the hardware.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from functools import cached_property

import torch

ROOT = -1


@dataclass(frozen=True)
class DraftTree:
    tokens: tuple[int, ...] = ()
    parents: tuple[int, ...] = ()
    sources: tuple[str, ...] = ()
    priors: tuple[float, ...] = ()  # empty means 1.0 for every node

    def __post_init__(self) -> None:
        if not self.priors and self.tokens:
            object.__setattr__(self, "priors", (1.0,) * len(self.tokens))
        if not len(self.tokens) == len(self.parents) == len(self.sources) == len(self.priors):
            raise ValueError(
                f"tokens, parents, sources and priors must have one entry per node, got "
                f"{len(self.tokens)}, {len(self.parents)}, {len(self.sources)}, {len(self.priors)}"
            )
        for index, parent in enumerate(self.parents):
            if not ROOT <= parent < index:
                raise ValueError(
                    f"node {index} has parent {parent}: a parent must be ROOT (-1) or an "
                    f"earlier node"
                )

    def __len__(self) -> int:
        return len(self.tokens)

    # ---- construction -------------------------------------------------------------------------

    @classmethod
    def from_sequences(
        cls, sequences: Iterable[tuple[Sequence[int], str]], budget: int | None = None
    ) -> DraftTree:
        """A trie of token sequences (each tagged with its source), shared prefixes merged.

        Sequences are inserted in the given order, so put the most promising first: when the
        node ``budget`` runs out, the sequence being inserted is cut and the rest are dropped.
        """
        builder = _TrieBuilder()
        for tokens, source in sequences:
            if not builder.insert(tokens, source, budget):
                break
        return builder.build()

    @classmethod
    def from_weighted(
        cls, candidates: Iterable[WeightedDraft], budget: int | None = None
    ) -> DraftTree:
        """A trie of candidates whose tokens carry reach probabilities; the likeliest nodes kept.

        A node's mass is the summed reach probability of the distinct events through it (a
        candidate's choice chain at that token, see ``WeightedDraft.choices``); its prior is its
        mass over its parent's. With a ``budget``, the ``budget`` heaviest nodes are kept —
        always a connected tree, since a node's mass is capped at its parent's.
        """
        builder = _TrieBuilder()
        masses: list[float] = []
        counted: list[set[int]] = []  # per node, the choice chains already in its mass
        for draft in candidates:
            node = ROOT
            choices = draft.choices or (None,) * len(draft.tokens)
            for token, source, reach, choice in zip(draft.tokens, draft.sources, draft.reach,
                                                    choices):
                child = builder.find_or_add(token, node, source, None)
                if child == len(masses):
                    masses.append(0.0)
                    counted.append(set())
                if choice is None or choice not in counted[child]:
                    masses[child] += reach
                    if choice is not None:
                        counted[child].add(choice)
                node = child
        tree = builder.build()
        # Options a drafter over-weights (shares summing past 1) may outweigh their parent.
        for node, parent in enumerate(tree.parents):
            if parent != ROOT:
                masses[node] = min(masses[node], masses[parent])
        priors = tuple(
            min(1.0, mass / (1.0 if parent == ROOT else masses[parent])) if mass > 0 else 0.0
            for mass, parent in zip(masses, tree.parents)
        )
        tree = DraftTree(tree.tokens, tree.parents, tree.sources, priors)
        if budget is None or len(tree) <= budget:
            return tree
        ranked = sorted(range(len(tree)), key=lambda node: (-masses[node], node))
        return tree.subtree(sorted(ranked[:budget]))

    def subtree(self, nodes: Sequence[int]) -> DraftTree:
        """The tree restricted to ``nodes`` (ascending; every kept node's parent must be kept)."""
        position = {ROOT: ROOT}
        for new_index, node in enumerate(nodes):
            if self.parents[node] not in position:
                raise ValueError(f"node {node} kept without its parent {self.parents[node]}")
            position[node] = new_index
        return DraftTree(
            tuple(self.tokens[n] for n in nodes),
            tuple(position[self.parents[n]] for n in nodes),
            tuple(self.sources[n] for n in nodes),
            tuple(self.priors[n] for n in nodes),
        )

    def merge(self, other: DraftTree, budget: int | None = None, under: int = ROOT) -> DraftTree:
        """This tree with ``other``'s nodes added (shared prefixes merged) within ``budget``.

        ``other`` hangs below node ``under`` (the root by default): its top-level nodes become
        that node's children. This tree's nodes keep their indices."""
        if not ROOT <= under < len(self):
            raise ValueError(f"cannot merge below node {under}: the tree has {len(self)} nodes")
        builder = _TrieBuilder.of(self)
        placed: dict[int, int] = {ROOT: under}  # other's node -> node in the merged tree
        for index, (token, parent, source, prior) in enumerate(
            zip(other.tokens, other.parents, other.sources, other.priors)
        ):
            node = builder.find_or_add(token, placed[parent], source, budget, prior)
            if node is None:
                break
            placed[index] = node
        return builder.build()

    # ---- structure ----------------------------------------------------------------------------

    @cached_property
    def depths(self) -> tuple[int, ...]:
        """Depth of each node below the root (children of the root have depth 1)."""
        depths: list[int] = []
        for parent in self.parents:
            depths.append(1 if parent == ROOT else depths[parent] + 1)
        return tuple(depths)

    @cached_property
    def reaches(self) -> tuple[float, ...]:
        """Each node's prior times its ancestors': the drafter's chance that it is accepted."""
        reaches: list[float] = []
        for parent, prior in zip(self.parents, self.priors):
            reaches.append(prior if parent == ROOT else reaches[parent] * prior)
        return tuple(reaches)

    def leaves(self) -> list[int]:
        """The nodes without children, in index order."""
        has_child = {parent for parent in self.parents if parent != ROOT}
        return [node for node in range(len(self)) if node not in has_child]

    @cached_property
    def _children(self) -> tuple[dict[int, int], ...]:
        """For each row, token → child node. Row 0 is the root."""
        children: tuple[dict[int, int], ...] = tuple({} for _ in range(len(self) + 1))
        for index, (token, parent) in enumerate(zip(self.tokens, self.parents)):
            children[parent + 1].setdefault(token, index)
        return children

    def child(self, node: int, token: int) -> int | None:
        """The child of ``node`` (``ROOT`` allowed) that holds ``token``, if any."""
        return self._children[node + 1].get(token)

    def path_along(self, tokens: Sequence[int]) -> list[int]:
        """The nodes from the root down whose tokens are ``tokens``' first ones (as far as the
        tree holds them): what a model that writes ``tokens`` accepts."""
        path: list[int] = []
        node = ROOT
        for token in tokens:
            child = self.child(node, token)
            if child is None:
                break
            path.append(child)
            node = child
        return path

    def child_count(self, node: int) -> int:
        """How many children ``node`` (``ROOT`` allowed) has."""
        return len(self._children[node + 1])

    def path_to(self, node: int) -> list[int]:
        """Node indices from the root's child down to ``node`` (inclusive)."""
        path: list[int] = []
        while node != ROOT:
            path.append(node)
            node = self.parents[node]
        return path[::-1]

    def paths(self) -> list[list[int]]:
        """Every root-to-leaf path, as node indices."""
        return [self.path_to(leaf) for leaf in self.leaves()]

    def max_depth(self) -> int:
        return max(self.depths, default=0)

    # ---- what the verifier feeds the model ----------------------------------------------------

    def ancestor_matrix(self) -> torch.Tensor:
        """Bool ``[n+1, n+1]``: row r may attend to row c (c is r itself or an ancestor)."""
        size = len(self) + 1
        visible = torch.zeros(size, size, dtype=torch.bool)
        visible[0, 0] = True
        for index, parent in enumerate(self.parents):
            row = index + 1
            visible[row] = visible[parent + 1]
            visible[row, row] = True
        return visible

    def attention_mask(
        self, prefix_length: int, dtype: torch.dtype, device: torch.device | str = "cpu",
        lead: int = 0,
    ) -> torch.Tensor:
        """Additive mask ``[1, 1, rows, prefix_length + rows]`` with ``rows = lead + n+1``: 0
        where visible, dtype-min elsewhere.

        ``lead`` plain tokens run in the same forward before the root (the prompt, when the first
        tree rides on the prefill): each sees the prefix and the lead tokens up to itself. Every
        tree row sees the whole prefix, every lead token, itself and its ancestors — never a
        sibling.
        """
        size = len(self) + 1
        rows = lead + size
        visible = torch.ones(rows, prefix_length + rows, dtype=torch.bool)
        visible[:lead, prefix_length:] = torch.ones(lead, rows, dtype=torch.bool).tril()
        visible[lead:, prefix_length + lead:] = self.ancestor_matrix()
        mask = torch.zeros(visible.shape, dtype=dtype)
        mask.masked_fill_(~visible, torch.finfo(dtype).min)
        return mask.to(device)[None, None]

    def position_ids(self, prefix_length: int, device: torch.device | str = "cpu",
                     lead: int = 0) -> torch.Tensor:
        """``[1, lead + n+1]`` positions: ``lead`` plain tokens from ``prefix_length`` on, then
        the root, each node one below its parent."""
        offsets = torch.tensor((*range(lead), *(lead + d for d in (0, *self.depths))),
                               dtype=torch.long)
        return (offsets + prefix_length).to(device)[None]

    def input_ids(self, pending: Sequence[int], device: torch.device | str = "cpu"
                  ) -> torch.Tensor:
        """``[1, len(pending) + n]``: the tokens not yet cached (the last is the root), then the
        nodes."""
        return torch.tensor([(*pending, *self.tokens)], dtype=torch.long, device=device)


@dataclass(frozen=True)
class WeightedDraft:
    """One candidate continuation: per token, its source and its reach probability (the chance
    that the model writes this candidate at least up to and including that token)."""

    tokens: tuple[int, ...]
    sources: tuple[str, ...]
    reach: tuple[float, ...]
    # Per token, which chain of the drafter's choices leads to it. Candidates that share a
    # choice chain at a node are the same event there (two values after one parameter name
    # both pass through that name) and count once in its mass. None: the candidate is an
    # event of its own at every token.
    choices: tuple[int, ...] | None = None


class _TrieBuilder:
    """Mutable helper that grows a trie node by node; ``build`` freezes it into a DraftTree."""

    def __init__(self) -> None:
        self.tokens: list[int] = []
        self.parents: list[int] = []
        self.sources: list[str] = []
        self.priors: list[float] = []
        self.children: list[dict[int, int]] = [{}]  # per row; row 0 is the root

    @classmethod
    def of(cls, tree: DraftTree) -> _TrieBuilder:
        builder = cls()
        for token, parent, source, prior in zip(tree.tokens, tree.parents, tree.sources,
                                                tree.priors):
            builder._add(token, parent, source, prior)
        return builder

    def _add(self, token: int, parent: int, source: str, prior: float = 1.0) -> int:
        index = len(self.tokens)
        self.tokens.append(token)
        self.parents.append(parent)
        self.sources.append(source)
        self.priors.append(prior)
        self.children.append({})
        self.children[parent + 1].setdefault(token, index)
        return index

    def find_or_add(
        self, token: int, parent: int, source: str, budget: int | None, prior: float = 1.0
    ) -> int | None:
        """The child of ``parent`` holding ``token``, added if new; None if over ``budget``."""
        existing = self.children[parent + 1].get(token)
        if existing is not None:
            return existing
        if budget is not None and len(self.tokens) >= budget:
            return None
        return self._add(token, parent, source, prior)

    def insert(self, tokens: Sequence[int], source: str, budget: int | None) -> bool:
        """Insert one sequence below the root; False once the budget is exhausted."""
        node: int | None = ROOT
        for token in tokens:
            node = self.find_or_add(token, node, source, budget)
            if node is None:
                return False
        return budget is None or len(self.tokens) < budget

    def build(self) -> DraftTree:
        return DraftTree(
            tuple(self.tokens), tuple(self.parents), tuple(self.sources), tuple(self.priors)
        )
