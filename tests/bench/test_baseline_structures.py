"""The data structures behind the model-free baselines, checked against brute force on toy data."""

import random

import pytest

from toolspec.bench.baselines.adjacency import (
    TOKEN_RECYCLING_TREE,
    AdjacencyMatrix,
    TreeTemplate,
)
from toolspec.bench.baselines.suffix_automaton import Match, SuffixAutomaton
from toolspec.core.draft_tree import ROOT
from toolspec.drafting.best_first import best_first_tree
from toolspec.drafting.suffix_positions import SuffixPositions
from toolspec.drafting.suffix_trie import SuffixTrie


def occurs(pattern: list[int], text: list[int]) -> bool:
    n = len(pattern)
    return any(text[i : i + n] == pattern for i in range(len(text) - n + 1))


def longest_occurring_suffix(stream: list[int], text: list[int]) -> int:
    return max(n for n in range(len(stream) + 1) if occurs(stream[len(stream) - n :], text))


def random_text(rng: random.Random, length: int, alphabet: int = 3) -> list[int]:
    return [rng.randrange(alphabet) for _ in range(length)]


# ---- suffix automaton ----------------------------------------------------------------------------

def test_automaton_accepts_exactly_the_substrings() -> None:
    rng = random.Random(0)
    for _ in range(20):
        text = random_text(rng, rng.randint(2, 14))
        automaton = SuffixAutomaton(text)
        assert len(automaton) <= 2 * len(text) - 1  # states, the root included
        for _ in range(40):
            pattern = random_text(rng, rng.randint(1, 5))
            found = automaton.match(pattern).length == len(pattern)
            assert found == occurs(pattern, text), (text, pattern)


def test_streaming_match_is_the_longest_occurring_suffix_and_its_first_occurrence() -> None:
    rng = random.Random(1)
    for _ in range(20):
        text = random_text(rng, 12)
        automaton = SuffixAutomaton(text)
        stream: list[int] = []
        match = Match()
        for token in random_text(rng, 15):
            stream.append(token)
            match = automaton.step(match, token)
            assert match.length == longest_occurring_suffix(stream, text)
            if match.length:
                suffix = stream[len(stream) - match.length :]
                first = min(i + match.length for i in range(len(text))
                            if text[i : i + match.length] == suffix)
                assert automaton.first_end(match) == first


def test_known_match_and_continuation() -> None:
    automaton = SuffixAutomaton([1, 2, 3, 2, 3, 4])
    match = automaton.match([9, 2, 3])
    assert match.length == 2
    assert automaton.continuation(match, 3) == [2, 3, 4]  # after the first "2 3"
    assert automaton.continuation(automaton.match([7]), 3) == []


def test_growing_automaton_keeps_earlier_matches_valid() -> None:
    # The dynamic use: match each token against the text before it, then add it. Splits of
    # states by later tokens must not corrupt the running match.
    rng = random.Random(2)
    for _ in range(30):
        text = random_text(rng, 30, alphabet=rng.choice((2, 3)))
        automaton = SuffixAutomaton()
        match = Match()
        for position, token in enumerate(text):
            match = automaton.step(match, token)
            assert match.length == longest_occurring_suffix(text[: position + 1], text[:position])
            automaton.extend(token)


def test_documents_are_kept_apart() -> None:
    automaton = SuffixAutomaton()
    automaton.add_document([1, 2, 3])
    automaton.add_document([3, 4, 5])
    assert automaton.match([2, 3, 4]).length == 2  # "3 4", never "2 3 4" across documents
    assert automaton.continuation(automaton.match([1, 2]), 5) == [3]  # stops at its document's end
    with pytest.raises(ValueError):
        automaton.add_document([-1])


# ---- suffix trie -------------------------------------------------------------------------------

def test_suffix_trie_counts_on_a_toy_sequence() -> None:
    trie = SuffixTrie(max_depth=3)
    trie.add([1, 2, 1, 2])
    assert trie.counts() == {(1,): 2, (2,): 2, (1, 2): 2, (2, 1): 1, (1, 2, 1): 1, (2, 1, 2): 1}
    assert trie.root.count == 4
    assert len(trie.suffix_nodes([7, 2, 1, 2])) == 3
    assert len(trie.suffix_nodes([2, 2])) == 1
    assert trie.suffix_nodes([5]) == []


def test_removal_undoes_addition() -> None:
    rng = random.Random(3)
    for depth in (1, 2, 5):
        texts = [random_text(rng, rng.randint(0, 20)) for _ in range(4)]
        batch, without_first = SuffixTrie(depth), SuffixTrie(depth)
        for text in texts:
            batch.add(text)
        assert batch.root.count == sum(map(len, texts))
        for text in texts[1:]:
            without_first.add(text)
        batch.remove(texts[0])
        assert batch.counts() == without_first.counts()
        for text in texts[1:]:
            batch.remove(text)
        assert batch.counts() == {} and batch.root.count == 0


def _subtree(index, node, levels: int) -> list:  # noqa: ANN001 - either index type
    """(token, probability, count, has children, children...) below ``node``, in offer order."""
    if levels == 0:
        return []
    return [(token, probability, child.count, index.has_children(child),
             _subtree(index, child, levels - 1))
            for token, probability, child in index.candidates(node)]


def test_suffix_positions_answer_like_the_trie_of_the_same_sequence() -> None:
    rng = random.Random(5)
    for depth in (1, 2, 4, 24):
        for length in (1, 2, 7, 40):
            sequence = [rng.randrange(4) for _ in range(length)]
            trie, positions = SuffixTrie(depth), SuffixPositions(depth)
            trie.add(sequence)
            cut = rng.randrange(length + 1)  # grown in two pieces, as prompt and then output
            positions.extend(sequence[:cut])
            positions.extend(sequence[cut:])
            contexts = [sequence, sequence[: length // 2], [rng.randrange(5) for _ in range(6)], []]
            for context in contexts:
                from_trie = trie.suffix_nodes(context)
                from_positions = positions.suffix_nodes(context)
                assert len(from_trie) == len(from_positions)
                for trie_node, positions_node in zip(from_trie, from_positions):
                    assert trie_node.count == positions_node.count
                    assert trie.has_children(trie_node) == positions.has_children(positions_node)
                    assert _subtree(trie, trie_node, 3) == _subtree(positions, positions_node, 3)


# ---- adjacency matrix and the static tree ------------------------------------------------------

def test_adjacency_rows_are_replaced_by_logits_and_promoted_by_bigrams() -> None:
    matrix = AdjacencyMatrix(k=3)
    matrix.set_row(5, [1, 2, 3, 4])
    assert matrix.row(5) == (1, 2, 3)
    matrix.promote(5, 3)
    assert matrix.row(5) == (3, 1, 2)
    matrix.promote(5, 9)
    assert matrix.row(5) == (9, 3, 1)
    matrix.promote_sequence([7, 8, 7, 9])
    assert matrix.row(7) == (9, 8) and matrix.row(8) == (7,)
    assert matrix.row(42) == ()


def test_token_recycling_tree_has_the_papers_shape() -> None:
    tree = TOKEN_RECYCLING_TREE
    assert len(tree) == 80 and tree.width == 8
    depths: list[int] = []
    for parent in tree.parents:
        depths.append(1 if parent == ROOT else depths[parent] + 1)
    assert max(depths) == 6
    assert [rank for rank, _ in tree.children_of(ROOT)] == list(range(8))
    with pytest.raises(ValueError):
        TreeTemplate.from_widths([1, 1])  # the second node's width has no node


# ---- best-first trees --------------------------------------------------------------------------

def test_best_first_tree_keeps_the_likeliest_connected_nodes() -> None:
    # A binary tree of keys (path tuples): the left child has probability 0.7, the right 0.3.
    def children(path: tuple[int, ...]) -> list[tuple[int, float, tuple[int, ...]]]:
        return [(0, 0.7, (*path, 0)), (1, 0.3, (*path, 1))] if len(path) < 4 else []

    scored = best_first_tree(children, (), budget=4, source="toy")
    tree = scored.tree
    assert len(tree) == 4 and set(tree.sources) == {"toy"}
    reaches = {(0,): 0.7, (0, 0): 0.49, (0, 0, 0): 0.343, (1,): 0.3}
    paths = {tuple(tree.tokens[n] for n in tree.path_to(node)) for node in range(len(tree))}
    assert paths == set(reaches)
    assert scored.expected_accepted == pytest.approx(sum(reaches.values()))
    assert set(tree.priors) == {0.7, 0.3}
    assert len(best_first_tree(children, (), 100, "toy", min_reach=0.3).tree) == 4
    assert len(best_first_tree(children, (), 0, "toy").tree) == 0
