"""Shared test fixtures: tiny random models, a toy tokenizer and a scripted drafter."""

from __future__ import annotations

import random
from collections.abc import Sequence
from pathlib import Path

import torch
from tokenizers import Tokenizer, decoders, models, pre_tokenizers
from transformers import (
    AutoModelForCausalLM,
    LlamaConfig,
    PreTrainedModel,
    PreTrainedTokenizerFast,
    Qwen2Config,
)

from toolspec.core.draft_tree import ROOT, DraftTree
from toolspec.core.drafter import DraftRequest

REPO = Path(__file__).resolve().parents[1]  # the checkout: scripts/, serve_config.yaml, ...
TEST_DATA = REPO / "tests" / "data"


def tiny_model(family: str, vocab_size: int = 96, seed: int = 0) -> PreTrainedModel:
    """A randomly initialised 2-layer model of the given family, fp32, eval mode."""
    common = dict(
        vocab_size=vocab_size,
        hidden_size=48,
        intermediate_size=96,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=512,
        tie_word_embeddings=False,
    )
    config = {"qwen2": Qwen2Config, "llama": LlamaConfig}[family](**common)
    torch.manual_seed(seed)
    model = AutoModelForCausalLM.from_config(config, dtype=torch.float32).eval()
    # Random init gives nearly flat logits; sharpen them so greedy choices are far from ties.
    with torch.no_grad():
        model.lm_head.weight.mul_(20.0)
    return model


class ToyTokenizer:
    """Token ids as space-separated numbers; enough for the engine's stop handling."""

    eos_token_id = None

    def decode(self, ids: Sequence[int], skip_special_tokens: bool = True,
               clean_up_tokenization_spaces: bool = False) -> str:
        return "".join(f"<{i}>" for i in ids)


class ScriptedDrafter:
    """Knows the true continuation; proposes it cut at a random depth plus random wrong branches."""

    name = "scripted"

    def __init__(self, truth: Sequence[int], vocab_size: int, seed: int) -> None:
        self.truth = tuple(truth)
        self.vocab_size = vocab_size
        self.rng = random.Random(seed)
        self.emitted = 0

    def start(self, request: DraftRequest) -> None:
        self.emitted = 0

    def propose(self, context: Sequence[int], budget: int) -> DraftTree:
        depth = self.rng.randint(0, budget)
        true_path = list(self.truth[self.emitted : self.emitted + depth])
        tree = DraftTree.from_sequences([(true_path, "truth")], budget)
        while len(tree) < budget:
            attach = self.rng.randrange(-1, len(tree)) if len(tree) else ROOT
            prefix = [] if attach == ROOT else [tree.tokens[n] for n in tree.path_to(attach)]
            branch = [self.rng.randrange(self.vocab_size) for _ in range(self.rng.randint(1, 3))]
            tree = tree.merge(DraftTree.from_sequences([(prefix + branch, "noise")]), budget)
        return tree

    def observe(self, emitted: Sequence[int]) -> None:
        self.emitted += len(emitted)

    def stop(self) -> None:
        pass


class FixedTreeDrafter:
    """Always proposes the same tree (for distribution tests)."""

    name = "fixed"

    def __init__(self, tree: DraftTree) -> None:
        self.tree = tree

    def start(self, request: DraftRequest) -> None:
        pass

    def propose(self, context: Sequence[int], budget: int) -> DraftTree:
        return self.tree

    def observe(self, emitted: Sequence[int]) -> None:
        pass

    def stop(self) -> None:
        pass


def toy_fast_tokenizer(words: Sequence[str] = ('{"name": "', '", "arguments": {"', '": "', '"}}',
                                               "true", "false", "null")) -> PreTrainedTokenizerFast:
    """A byte-level BPE tokenizer (every byte is a token) with merges that make each of
    ``words`` one token, ``<eos>`` as a special token and ``<tool_call>``/``</tool_call>`` as
    added tokens (like Qwen's): a real fast tokenizer with a vocabulary of a few hundred."""
    to_unicode = _byte_level_alphabet()
    vocab = {char: index for index, char in enumerate(sorted(to_unicode.values()))}
    merges: list[tuple[str, str]] = []
    for word in words:
        chars = [to_unicode[byte] for byte in word.encode()]
        merged = chars[0]
        for char in chars[1:]:
            if merged + char not in vocab:
                merges.append((merged, char))
                vocab[merged + char] = len(vocab)
            merged += char
    model = Tokenizer(models.BPE(vocab=vocab, merges=merges))
    model.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)
    model.decoder = decoders.ByteLevel()
    tokenizer = PreTrainedTokenizerFast(tokenizer_object=model)
    tokenizer.add_special_tokens({"eos_token": "<eos>"})
    tokenizer.add_tokens(["<tool_call>", "</tool_call>"])
    return tokenizer


def _byte_level_alphabet() -> dict[int, str]:
    """GPT-2's byte-to-character map used by byte-level BPE (printable bytes map to
    themselves, the rest to characters from U+0100 on)."""
    printable = [*range(ord("!"), ord("~") + 1), *range(0xA1, 0xAC + 1), *range(0xAE, 0xFF + 1)]
    mapping = {byte: chr(byte) for byte in printable}
    extra = 0
    for byte in range(256):
        if byte not in mapping:
            mapping[byte] = chr(256 + extra)
            extra += 1
    return mapping
