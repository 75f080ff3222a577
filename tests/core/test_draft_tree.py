import pytest
import torch

from toolspec.core.draft_tree import ROOT, DraftTree


def test_trie_merges_shared_prefixes_and_keeps_first_source() -> None:
    tree = DraftTree.from_sequences([([1, 2, 3], "a"), ([1, 2, 4], "b"), ([5], "c")])
    assert tree.tokens == (1, 2, 3, 4, 5)
    assert tree.parents == (ROOT, 0, 1, 1, ROOT)
    assert tree.sources == ("a", "a", "a", "b", "c")
    assert tree.depths == (1, 2, 3, 3, 1)
    assert tree.paths() == [[0, 1, 2], [0, 1, 3], [4]]


def test_budget_cuts_the_sequence_being_inserted_and_drops_the_rest() -> None:
    tree = DraftTree.from_sequences([([1, 2, 3], "a"), ([1, 7, 8], "b"), ([9], "c")], budget=4)
    assert tree.tokens == (1, 2, 3, 7)
    assert len(tree) == 4


def test_child_lookup() -> None:
    tree = DraftTree.from_sequences([([1, 2], "a"), ([3], "a")])
    assert tree.child(ROOT, 1) == 0
    assert tree.child(ROOT, 3) == 2
    assert tree.child(0, 2) == 1
    assert tree.child(0, 3) is None
    assert tree.child(1, 2) is None


def test_mask_lets_each_node_see_prefix_itself_and_ancestors_only() -> None:
    tree = DraftTree.from_sequences([([10, 11], "a"), ([12], "a")])
    mask = tree.attention_mask(prefix_length=2, dtype=torch.float32)
    assert mask.shape == (1, 1, 4, 6)
    visible = (mask[0, 0] == 0).int().tolist()
    assert visible == [
        # prefix   root  10  11  12
        [1, 1, 1, 0, 0, 0],  # root
        [1, 1, 1, 1, 0, 0],  # 10
        [1, 1, 1, 1, 1, 0],  # 11 (child of 10)
        [1, 1, 1, 0, 0, 1],  # 12 (child of root, sibling of 10)
    ]
    assert mask[0, 0, 0, 3] == torch.finfo(torch.float32).min
    assert tree.position_ids(prefix_length=2).tolist() == [[2, 3, 4, 3]]
    assert tree.input_ids([7]).tolist() == [[7, 10, 11, 12]]


def test_lead_tokens_before_the_root_are_causal_and_seen_by_every_node() -> None:
    tree = DraftTree.from_sequences([([10, 11], "a"), ([12], "a")])
    mask = tree.attention_mask(prefix_length=1, dtype=torch.float32, lead=2)
    visible = (mask[0, 0] == 0).int().tolist()
    assert visible == [
        # prefix  lead lead root 10  11  12
        [1, 1, 0, 0, 0, 0, 0],  # first lead token
        [1, 1, 1, 0, 0, 0, 0],  # second lead token
        [1, 1, 1, 1, 0, 0, 0],  # root
        [1, 1, 1, 1, 1, 0, 0],  # 10
        [1, 1, 1, 1, 1, 1, 0],  # 11 (child of 10)
        [1, 1, 1, 1, 0, 0, 1],  # 12 (child of root)
    ]
    assert tree.position_ids(prefix_length=1, lead=2).tolist() == [[1, 2, 3, 4, 5, 4]]
    assert tree.input_ids([5, 6, 7]).tolist() == [[5, 6, 7, 10, 11, 12]]


def test_empty_tree_is_just_the_root() -> None:
    tree = DraftTree()
    assert len(tree) == 0
    assert tree.paths() == []
    assert tree.attention_mask(3, torch.float32).shape == (1, 1, 1, 4)
    assert tree.max_depth() == 0


def test_merge_adds_other_trees_nodes_under_matching_paths() -> None:
    first = DraftTree.from_sequences([([1, 2], "fsm")])
    second = DraftTree.from_sequences([([1, 3], "pld"), ([4], "pld")])
    merged = first.merge(second)
    assert merged.tokens == (1, 2, 3, 4)
    assert merged.parents == (ROOT, 0, 0, ROOT)
    assert merged.sources == ("fsm", "fsm", "pld", "pld")
    assert first.merge(second, budget=3).tokens == (1, 2, 3)


def test_merge_under_a_node_hangs_the_other_tree_below_it() -> None:
    tree = DraftTree.from_sequences([([1, 2], "fsm"), ([5], "fsm")])
    below = DraftTree.from_sequences([([3, 4], "suffix"), ([6], "suffix")])
    merged = tree.merge(below, under=1)
    assert merged.tokens[:3] == tree.tokens  # the tree's own nodes keep their indices
    assert [merged.tokens[n] for n in merged.path_to(merged.child(merged.child(1, 3), 4))] \
        == [1, 2, 3, 4]
    assert merged.child(1, 6) is not None and merged.child(ROOT, 6) is None
    assert tree.merge(below, budget=4, under=1).tokens == (1, 2, 5, 3)
    with pytest.raises(ValueError, match="below node 3"):
        tree.merge(below, under=3)


def test_reaches_multiply_priors_down_each_path_and_leaves_have_no_children() -> None:
    tree = DraftTree((1, 2, 3, 4), (ROOT, 0, 0, ROOT), ("a",) * 4, (0.5, 0.5, 0.25, 1.0))
    assert tree.reaches == (0.5, 0.25, 0.125, 1.0)
    assert tree.leaves() == [1, 2, 3]
    assert tree.paths() == [[0, 1], [0, 2], [3]]


@pytest.mark.parametrize(
    "tokens,parents,sources",
    [((1, 2), (ROOT, 1), ("a", "a")), ((1,), (ROOT, 0), ("a",)), ((1,), (-2,), ("a",))],
)
def test_invalid_trees_are_rejected(tokens, parents, sources) -> None:
    with pytest.raises(ValueError):
        DraftTree(tokens, parents, sources)


def test_weighted_candidates_sum_mass_and_keep_the_heaviest_nodes() -> None:
    from toolspec.core.draft_tree import WeightedDraft

    a = WeightedDraft((1, 2, 3), ("s", "s", "s"), (0.5, 0.5, 0.4))
    b = WeightedDraft((1, 4), ("s", "t"), (0.5, 0.25))
    tree = DraftTree.from_weighted([a, b])
    assert tree.tokens == (1, 2, 3, 4)
    assert tree.priors == pytest.approx((1.0, 0.5, 0.8, 0.25))
    assert tree.sources == ("s", "s", "s", "t")
    pruned = DraftTree.from_weighted([a, b], budget=3)
    assert pruned.tokens == (1, 2, 3) and pruned.parents == (ROOT, 0, 1)


def test_candidates_sharing_a_choice_chain_count_once_in_its_mass() -> None:
    """Two values after one parameter name both pass through that name: one event there, so
    the name's mass is its own probability and each value's prior is its share of it."""
    from toolspec.core.draft_tree import WeightedDraft

    name, value_a, value_b = hash("name"), hash("a"), hash("b")
    bare = WeightedDraft((1, 2), ("s", "s"), (1.0, 1.0), (name, name))
    a = WeightedDraft((1, 2, 3), ("s", "s", "s"), (1.0, 1.0, 0.5), (name, name, value_a))
    b = WeightedDraft((1, 2, 4), ("s", "s", "s"), (1.0, 1.0, 0.25), (name, name, value_b))
    tree = DraftTree.from_weighted([bare, a, b])
    assert tree.priors == pytest.approx((1.0, 1.0, 0.5, 0.25))
    # Without choice chains every candidate is its own event: the name's mass triples.
    plain = DraftTree.from_weighted([WeightedDraft(d.tokens, d.sources, d.reach)
                                     for d in (bare, a, b)])
    assert plain.priors[2] == pytest.approx(0.5 / 3)


def test_an_option_never_outweighs_its_parent() -> None:
    """Shares past 1 (two chains through one child) are capped, keeping pruned trees connected."""
    from toolspec.core.draft_tree import WeightedDraft

    a = WeightedDraft((1, 2), ("s", "s"), (0.5, 0.5), (1, 2))
    b = WeightedDraft((1, 2, 3), ("s", "s", "s"), (0.5, 0.5, 0.5), (1, 3, 4))
    tree = DraftTree.from_weighted([a, b], budget=2)
    assert tree.tokens == (1, 2) and tree.priors == pytest.approx((0.5, 1.0))


def test_subtree_requires_parents_and_remaps_them() -> None:
    tree = DraftTree.from_sequences([([1, 2, 3], "a"), ([1, 4], "b")])
    assert tree.subtree([0, 3]).parents == (ROOT, 0)
    assert tree.subtree([0, 3]).tokens == (1, 4)
    with pytest.raises(ValueError, match="without its parent"):
        tree.subtree([1])


def test_path_along_follows_the_tokens_as_far_as_the_tree_holds_them() -> None:
    tree = DraftTree.from_sequences([([1, 2, 3], "a"), ([1, 4], "b")])
    assert [tree.tokens[n] for n in tree.path_along([1, 2, 3, 9])] == [1, 2, 3]
    assert [tree.tokens[n] for n in tree.path_along([1, 4])] == [1, 4]
    assert tree.path_along([7]) == [] and tree.path_along([]) == []
    assert tree.child_count(ROOT) == 1 and tree.child_count(tree.path_along([1])[0]) == 2
