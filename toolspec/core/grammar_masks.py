"""Grammar-constrained token choice: llguidance token masks applied before every choice.

``GrammarCompiler`` holds one model's llguidance tokenizer (built once: ~1-3 s for a 150k
vocabulary) and compiled grammars, the most recently used kept (compiling is milliseconds per
tool set, but a replica sees the same tool sets again and again). ``GrammarConstraint`` is one
compiled grammar; each generation gets a fresh matcher from it.

``ConstrainedChooser`` is a ``TokenChooser`` whose every choice is made from the logits masked
by the grammar's current token mask (greedy: masked argmax; sampled: the masked distribution,
then temperature / top-k / top-p), after which the matcher advances by the chosen token. Since
verification chooses each emitted token through the chooser, in order along the accepted path,
speculative constrained decoding emits exactly what plain constrained ("masked AR") decoding
emits: a draft token is accepted iff it equals the masked choice.
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from collections.abc import Iterable, Mapping

import llguidance
import llguidance.hf
import numpy as np
import torch
from transformers.tokenization_utils_base import PreTrainedTokenizerBase

from toolspec.calls.tool_grammar import added_token_ids, grammar_message
from toolspec.core.sampling import SamplingParams, TokenChooser, draw, target_distribution


class GrammarError(RuntimeError):
    """A grammar that does not compile, or a matcher that reached a state it cannot leave."""


class GrammarConstraint:
    """One compiled grammar over one tokenizer; ``matcher()`` gives a fresh parse of it.

    The pristine matcher is never advanced, only copied (cheap: the compiled grammar is
    shared), so one constraint serves any number of generations.
    """

    def __init__(self, pristine: llguidance.LLMatcher, vocab_size: int) -> None:
        self._pristine = pristine
        self._lock = threading.Lock()
        self.vocab_size = vocab_size

    def matcher(self) -> llguidance.LLMatcher:
        with self._lock:
            return self._pristine.deep_copy()

    def chooser(self, params: SamplingParams) -> ConstrainedChooser:
        return ConstrainedChooser(params, self.matcher(), self.vocab_size)


class GrammarCompiler:
    """Compiles Lark grammars for one tokenizer; keeps the ``capacity`` most recently used.

    ``vocab_size`` is the width of the model's logits (it may exceed the tokenizer's: padded
    rows are never allowed); ``eos_token_ids`` end a generation and are allowed once the
    grammar is complete. Mutates: its cache, on ``compile``.
    """

    def __init__(self, tokenizer: PreTrainedTokenizerBase, vocab_size: int,
                 eos_token_ids: Iterable[int], capacity: int = 64) -> None:
        eos = sorted(set(eos_token_ids))
        if not eos:
            raise ValueError("constrained decoding needs at least one end-of-sequence token id")
        try:
            self.tokenizer = llguidance.hf.from_tokenizer(tokenizer, n_vocab=vocab_size,
                                                          eos_token=eos)
        except ValueError as error:
            raise GrammarError(f"cannot build a grammar tokenizer: {error} (constrained "
                               "decoding needs a fast Hugging Face tokenizer)") from None
        self.vocab_size = vocab_size
        self.added_tokens: Mapping[str, int] = added_token_ids(tokenizer)
        self.capacity = capacity
        self._cache: OrderedDict[str, GrammarConstraint] = OrderedDict()
        self._lock = threading.Lock()
        self.compiled = 0  # grammars compiled (cache misses), for diagnostics

    def compile(self, lark: str) -> GrammarConstraint:
        """The constraint for Lark text ``lark`` (cached). Raises GrammarError."""
        with self._lock:
            cached = self._cache.pop(lark, None)
            if cached is None:
                cached = self._compile(lark)
                self.compiled += 1
            self._cache[lark] = cached
            while len(self._cache) > self.capacity:
                self._cache.popitem(last=False)
            return cached

    def _compile(self, lark: str) -> GrammarConstraint:
        grammar = llguidance.LLMatcher.grammar_from_lark(lark)
        error = llguidance.LLMatcher.validate_grammar(grammar, self.tokenizer)
        if error:
            raise GrammarError(f"the tool-call grammar does not compile: {grammar_message(error)}")
        matcher = llguidance.LLMatcher(self.tokenizer, grammar, log_level=0)
        if matcher.is_error():
            raise GrammarError(f"the tool-call grammar does not compile: {matcher.get_error()}")
        return GrammarConstraint(matcher, self.vocab_size)


class ConstrainedChooser(TokenChooser):
    """Chooses each token from the logits masked by ``matcher``'s grammar, then feeds it to
    the matcher. ``choose`` calls must follow the emitted sequence (as verification's walk
    does). Mutates: ``matcher`` (one token per ``choose``) and, sampled, the generator.
    """

    def __init__(self, params: SamplingParams, matcher: llguidance.LLMatcher,
                 vocab_size: int) -> None:
        super().__init__(params)
        self.matcher = matcher
        self.vocab_size = vocab_size

    def choose(self, row: int) -> int:
        if self._logits is None:
            raise RuntimeError("ConstrainedChooser.bind(logits) must be called before choose()")
        bits = self._mask_bits()
        if self._argmax is not None and _allowed(bits, self._argmax[row]):
            token = self._argmax[row]  # the unmasked argmax is allowed: it is the masked one
        else:
            logits = self.masked_logits(row, bits)
            if self.params.greedy:
                token = int(logits.argmax())
            else:
                token = draw(target_distribution(logits, self.params), self.generator)
        if not self.matcher.consume_token(token):
            raise GrammarError(f"the grammar refused token {token} it allowed: "
                               f"{self.matcher.get_error()}")
        return token

    def _mask_bits(self) -> np.ndarray:
        if self.matcher.is_error():
            raise GrammarError(f"the grammar matcher failed: {self.matcher.get_error()}")
        bits = np.frombuffer(self.matcher.compute_bitmask(), dtype=np.uint8)
        if not bits.any():
            raise GrammarError("the grammar allows no token here (not even end of sequence)")
        return bits

    def masked_logits(self, row: int, bits: np.ndarray | None = None) -> torch.Tensor:
        """Row ``row`` of the bound logits with every token the grammar refuses at -inf, on
        the logits' device (the mask is built on the CPU and moved there)."""
        if self._logits is None:
            raise RuntimeError("ConstrainedChooser.bind(logits) must be called first")
        allowed = self._allowed_tensor(self._mask_bits() if bits is None else bits)
        logits = self._logits[row]
        return logits.masked_fill(~allowed.to(logits.device, non_blocking=True), float("-inf"))

    def _allowed_tensor(self, bits: np.ndarray) -> torch.Tensor:
        width = self._logits.shape[-1] if self._logits is not None else self.vocab_size
        allowed = np.unpackbits(bits, bitorder="little")[:width].astype(bool)
        if allowed.size < width:  # logits wider than the grammar's vocabulary
            allowed = np.concatenate([allowed, np.zeros(width - allowed.size, dtype=bool)])
        return torch.from_numpy(allowed)


def _allowed(bits: np.ndarray, token: int) -> bool:
    byte = token >> 3
    return byte < bits.size and bool((bits[byte] >> (token & 7)) & 1)
