"""After a commit, the cache must equal one built by feeding the accepted path token by token."""

import random

import torch
from helpers import tiny_model

from toolspec import DraftTree, TargetModel
from toolspec.core.verify import AcceptedPath
from toolspec.model.target_model import commit_path


def test_commit_equals_token_by_token_cache(tiny_family: str) -> None:
    model = TargetModel(tiny_model(tiny_family, vocab_size=64))
    rng = random.Random(0)
    for trial in range(6):
        prompt = [rng.randrange(64) for _ in range(rng.randint(2, 30))]
        root = rng.randrange(64)
        # A tree with several branches; accept one path (not necessarily the first rows).
        sequences = [[rng.randrange(64) for _ in range(rng.randint(1, 5))] for _ in range(4)]
        tree = DraftTree.from_sequences((s, "t") for s in sequences)
        leaf = rng.choice(tree.paths())
        path = AcceptedPath(tuple(leaf), bonus=0)
        accepted_tokens = [tree.tokens[n] for n in leaf]
        probe = rng.randrange(64)

        speculative = model.new_cache()
        model.prefill(speculative, prompt)
        base = speculative.get_seq_length()
        model.forward_tree(speculative, [root], tree)
        commit_path(speculative, base, path.rows)
        assert speculative.get_seq_length() == len(prompt) + 1 + len(leaf)
        after_commit = model.prefill(speculative, [probe])

        reference = model.new_cache()
        model.prefill(reference, prompt)
        for token in [root, *accepted_tokens]:
            model.prefill(reference, [token])
        expected = model.prefill(reference, [probe])

        torch.testing.assert_close(after_commit, expected, atol=1e-5, rtol=0)
        for got, want in zip(speculative.layers, reference.layers):
            torch.testing.assert_close(got.keys, want.keys, atol=1e-5, rtol=0)
            torch.testing.assert_close(got.values, want.values, atol=1e-5, rtol=0)


def test_tree_logits_equal_sequential_logits(tiny_family: str) -> None:
    model = TargetModel(tiny_model(tiny_family, vocab_size=64))
    prompt, root = [5, 9, 2, 7], 11
    tree = DraftTree.from_sequences([([1, 2, 3], "t"), ([4, 5], "t"), ([1, 6], "t")])
    cache = model.new_cache()
    model.prefill(cache, prompt)
    tree_logits = model.forward_tree(cache, [root], tree)
    for leaf_path in tree.paths():
        sequential = model.new_cache()
        model.prefill(sequential, prompt)
        rows = [model.prefill(sequential, [root])]
        rows += [model.prefill(sequential, [tree.tokens[n]]) for n in leaf_path]
        for row, node in zip(rows, [-1, *leaf_path]):
            torch.testing.assert_close(tree_logits[node + 1], row, atol=1e-5, rtol=0)
