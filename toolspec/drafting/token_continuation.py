"""Token ids for drafted text, exactly as the model's tokenizer would split it in context.

A draft is only accepted token by token, so drafting the right *string* is not enough: its token
boundaries must match the model's. BPE merges across the boundary between what is already
generated and the drafted text (``"`` + ``name`` → ``{"``, ``":``; a partial word ``na`` +
``me`` → ``name``), so a string tokenized on its own often starts with the wrong token.

Method (token healing for drafts): re-tokenize the last few committed tokens together with the
drafted text. If the tokenizer reproduces those committed tokens, the tokens after them are the
draft. If it does not (the boundary would merge differently, e.g. the model emitted a
non-canonical split), shrink the window from the left until it does; with no committed tokens
left, the text is tokenized alone. Results are cached by (window, text); the texts drafted after
one window are tokenized together, in one call of the Rust tokenizer per window size.
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
        self.backend = tokenizer.backend_tokenizer  # the Rust tokenizer: batches without overhead
        self.window = window
        self.cache_size = cache_size
        self._cache: OrderedDict[tuple[tuple[int, ...], str], TokenizedContinuation] = OrderedDict()

    def continue_many(self, committed: Sequence[int], texts: Sequence[str]
                      ) -> list[TokenizedContinuation]:
        """For each of ``texts``, the token ids (and per-token end offsets in the text) that
        write it after ``committed``, tokenized together: one tokenizer call per window size
        instead of one per text (a step drafts a dozen texts after the same tail)."""
        tail = tuple(committed[-self.window:]) if self.window else ()
        results: list[TokenizedContinuation | None] = []
        for text in texts:
            cached = self._cache.get((tail, text))
            if cached is not None:
                self._cache.move_to_end((tail, text))
            results.append(cached)
        pending = sorted({text for text, result in zip(texts, results) if result is None})
        fresh = self._tokenize(tail, pending) if pending else {}
        for text, continuation in fresh.items():
            self._cache[(tail, text)] = continuation
        while len(self._cache) > self.cache_size:
            self._cache.popitem(last=False)
        return [result if result is not None else fresh[text]
                for text, result in zip(texts, results)]

    def _tokenize(self, tail: tuple[int, ...], texts: Sequence[str]
                  ) -> dict[str, TokenizedContinuation]:
        found: dict[str, TokenizedContinuation] = {}
        pending = list(texts)
        for start in range(len(tail) + 1):
            context_ids = tail[start:]
            context = self.tokenizer.decode(context_ids, skip_special_tokens=False,
                                            clean_up_tokenization_spaces=False)
            if "\ufffd" in context:  # a token split inside a character: decoding is not exact
                continue
            encodings = self.backend.encode_batch([context + text for text in pending],
                                                  add_special_tokens=False)
            unresolved = []
            for text, encoding in zip(pending, encodings):
                ids = encoding.ids
                if tuple(ids[: len(context_ids)]) != context_ids:
                    unresolved.append(text)
                    continue
                shift = len(context)
                # A token's offsets can start inside the context only when the boundary
                # merged, which the prefix check rules out; clamp for safety with special tokens.
                ends = tuple(max(0, end - shift) for _, end in encoding.offsets[len(context_ids):])
                found[text] = TokenizedContinuation(tuple(ids[len(context_ids):]), ends)
            pending = unresolved
            if not pending:
                break
        found.update((text, TokenizedContinuation((), ())) for text in pending)
        return found
