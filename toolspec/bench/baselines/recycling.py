"""Token Recycling (Luo et al., 2024): reuse the candidates the target model already ranked.

Every verification forward ranks a next token after every token it was shown, rejected drafts
included. Token Recycling keeps, per token, the top-k of its latest such ranking (an adjacency
matrix) and drafts by expanding the last token breadth-first through a static tree: the j-th
child of a node is the j-th candidate after the node's token. No model, no training.

Paper defaults: k = 8 candidates per token, an 80-node tree of depth 6 (``TOKEN_RECYCLING_TREE``),
the matrix kept across requests (it warms up over a workload, never reset). Our additions: the
tree is cut to the step's budget by likeliest nodes first, each node's prior being the observed
acceptance rate of its rank; bigrams of the prompt and of every emitted step are promoted in the
matrix. Where no logits are fed (the offline simulator has no model), those bigrams are all the
drafter learns: it then drafts the successors seen most recently, a weaker signal than the
model's own rankings, so simulated figures understate it.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence

from toolspec.bench.baselines.adjacency import (
    TOKEN_RECYCLING_TREE,
    AdjacencyMatrix,
    TreeTemplate,
)
from toolspec.core.draft_tree import ROOT, DraftTree
from toolspec.core.drafter import DraftRequest
from toolspec.drafting.best_first import Candidate, best_first_tree

# Before any evidence, the rank-r candidate is assumed accepted with 0.5 ** (r + 1).
_FIRST_RANK_PRIOR = 0.5

TemplateKey = tuple[int, int]  # (template node, its token)


class TokenRecyclingDrafter:
    """Drafts a static tree of candidates from an adjacency matrix learned from logits.

    Parameters: ``k`` candidates kept per token (paper: 8); ``template`` the tree shape (paper:
    the 80-node tree); ``learn_prompt`` promotes the prompt's bigrams at ``start``;
    ``smoothing`` pseudo-observations behind each rank's prior.
    Mutates: the matrix and the per-rank acceptance counts, across requests; the last proposed
    tree, per step.
    """

    name = "recycling"

    def __init__(
        self,
        k: int = 8,
        template: TreeTemplate = TOKEN_RECYCLING_TREE,
        learn_prompt: bool = True,
        smoothing: float = 4.0,
    ) -> None:
        if template.width > k:
            raise ValueError(f"the template reads {template.width} candidates per token, k is {k}")
        self.matrix = AdjacencyMatrix(k)
        self.template = template
        self.learn_prompt = learn_prompt
        self.smoothing = smoothing
        self._hits = [0.0] * k
        self._trials = [0.0] * k
        self._last_token: int | None = None
        self._tree = DraftTree()
        self._ranks: tuple[int, ...] = ()

    @property
    def logits_top_k(self) -> int:
        return self.matrix.k

    def rank_prior(self, rank: int) -> float:
        """Observed probability that the rank-``rank`` candidate is the next token, smoothed."""
        default = _FIRST_RANK_PRIOR ** (rank + 1)
        return (self._hits[rank] + self.smoothing * default) / (self._trials[rank] + self.smoothing)

    def start(self, request: DraftRequest) -> None:
        if self.learn_prompt:
            self.matrix.promote_sequence(request.prompt_ids)
        self._last_token = request.prompt_ids[-1] if request.prompt_ids else None
        self._tree, self._ranks = DraftTree(), ()

    def _children(self, key: TemplateKey) -> Iterable[Candidate[TemplateKey]]:
        node, token = key
        row = self.matrix.row(token)
        for rank, child in self.template.children_of(node):
            if rank < len(row):
                yield row[rank], self.rank_prior(rank), (child, row[rank])

    def propose(self, context: Sequence[int], budget: int) -> DraftTree:
        if not context:
            return DraftTree()
        size = min(budget, len(self.template))
        tree = best_first_tree(self._children, (ROOT, context[-1]), size, self.name).tree
        parent_tokens = [context[-1] if p == ROOT else tree.tokens[p] for p in tree.parents]
        self._tree = tree
        self._ranks = tuple(self.matrix.row(parent).index(token)
                            for parent, token in zip(parent_tokens, tree.tokens))
        return tree

    def observe_logits(self, tokens: Sequence[int], top_k_ids: Sequence[Sequence[int]]) -> None:
        for token, candidates in zip(tokens, top_k_ids):
            self.matrix.set_row(token, candidates)

    def observe(self, emitted: Sequence[int]) -> None:
        self._count_ranks(emitted)
        self._tree, self._ranks = DraftTree(), ()
        if not emitted:
            return
        previous = [] if self._last_token is None else [self._last_token]
        self.matrix.promote_sequence([*previous, *emitted])
        self._last_token = emitted[-1]

    def _count_ranks(self, emitted: Sequence[int]) -> None:
        # Walk the proposed tree along what the model emitted: at each node reached, every
        # drafted rank was put to the test and at most one was right.
        node = ROOT
        for token in emitted:
            for child, parent in enumerate(self._tree.parents):
                if parent == node:
                    self._trials[self._ranks[child]] += 1.0
            reached = self._tree.child(node, token)
            if reached is None:
                return
            self._hits[self._ranks[reached]] += 1.0
            node = reached

    def stop(self) -> None:
        self._tree, self._ranks = DraftTree(), ()
        self._last_token = None
