"""Token ids for drafted text, exactly as the model's tokenizer would split it in context.

A draft is only accepted token by token, so drafting the right *string* is not enough: its token
boundaries must match the model's. BPE merges across the boundary between what is already
generated and the drafted text (``"`` + ``name`` → ``{"``, ``":``; a partial word ``na`` +
``me`` → ``name``), so a string tokenized on its own often starts with the wrong token.

Method (token healing for drafts): re-tokenize the last few committed tokens together with the
drafted text. If the tokenizer reproduces those committed tokens, the tokens after them are the
draft. If it does not (the boundary would merge differently, e.g. the model emitted a
non-canonical split), shrink the window from the left until it does; with no committed tokens
left, the text is tokenized alone. Results are cached by (window, text).
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Sequence
from dataclasses import dataclass

from transformers.tokenization_utils_base import PreTrainedTokenizerBase


@dataclass(frozen=True)
class TokenizedContinuation:
    ids: tuple[int, ...]
    ends: tuple[int, ...]  # for each token, the offset in the text just past its last character


class TokenContinuer:
    """Tokenizes drafted text as a continuation of committed tokens.

    Mutates: an LRU cache of recent results.
    """

    def __init__(self, tokenizer: PreTrainedTokenizerBase, window: int = 4,
                 cache_size: int = 8192) -> None:
        if not getattr(tokenizer, "is_fast", False):
            raise TypeError("TokenContinuer needs a fast (Rust) tokenizer for character offsets")
        self.tokenizer = tokenizer
        self.window = window
        self.cache_size = cache_size
        self._cache: OrderedDict[tuple[tuple[int, ...], str], TokenizedContinuation] = OrderedDict()

    def continue_ids(self, committed: Sequence[int], text: str) -> TokenizedContinuation:
        """Token ids (and per-token end offsets in ``text``) that write ``text`` after ``committed``."""
        tail = tuple(committed[-self.window:]) if self.window else ()
        key = (tail, text)
        cached = self._cache.get(key)
        if cached is not None:
            self._cache.move_to_end(key)
            return cached
        result = self._tokenize(tail, text)
        self._cache[key] = result
        if len(self._cache) > self.cache_size:
            self._cache.popitem(last=False)
        return result

    def _tokenize(self, tail: tuple[int, ...], text: str) -> TokenizedContinuation:
        for start in range(len(tail) + 1):
            context_ids = tail[start:]
            context = self.tokenizer.decode(context_ids, skip_special_tokens=False,
                                            clean_up_tokenization_spaces=False)
            if "\ufffd" in context:  # a token split inside a character: decoding is not exact
                continue
            encoding = self.tokenizer(context + text, add_special_tokens=False,
                                      return_offsets_mapping=True)
            ids = encoding["input_ids"]
            if tuple(ids[: len(context_ids)]) != context_ids:
                continue
            offsets = encoding["offset_mapping"][len(context_ids):]
            shift = len(context)
            # A token's offsets can start inside the context only when the boundary merged,
            # which the prefix check above rules out; clamp for safety with special tokens.
            ends = tuple(max(0, end - shift) for _, end in offsets)
            return TokenizedContinuation(tuple(ids[len(context_ids):]), ends)
        return TokenizedContinuation((), ())
