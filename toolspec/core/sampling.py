"""How the next token is chosen from the target model's logits: greedy or sampled.

Both plain decoding and speculative verification choose every emitted token through a
``TokenChooser``, so the two are the same rule applied to the same logits. A sampled choice draws
exactly one uniform number per emitted token from the request's generator; speculative sampling
therefore consumes the random stream in the same order as plain sampling, and with a fixed seed
reproduces it token for token (up to float round-off in the logits).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch


@dataclass(frozen=True)
class SamplingParams:
    """``temperature == 0`` means greedy; ``top_k == 0`` and ``top_p == 1`` disable truncation."""

    temperature: float = 0.0
    top_p: float = 1.0
    top_k: int = 0
    seed: int | None = None

    def __post_init__(self) -> None:
        if self.temperature < 0:
            raise ValueError(f"temperature must be >= 0, got {self.temperature}")
        if not 0 < self.top_p <= 1:
            raise ValueError(f"top_p must be in (0, 1], got {self.top_p}")
        if self.top_k < 0:
            raise ValueError(f"top_k must be >= 0, got {self.top_k}")

    @property
    def greedy(self) -> bool:
        return self.temperature == 0


def target_distribution(logits: torch.Tensor, params: SamplingParams) -> torch.Tensor:
    """Probabilities of the next token after temperature, top-k and top-p (in that order).

    ``logits`` is one row ``[vocab]``; the result is float32 and sums to 1.
    """
    scaled = logits.float() / params.temperature
    if params.top_k and params.top_k < scaled.numel():
        kth = torch.topk(scaled, params.top_k).values[-1]
        scaled = scaled.masked_fill(scaled < kth, float("-inf"))
    probs = torch.softmax(scaled, dim=-1)
    if params.top_p < 1.0:
        sorted_probs, order = torch.sort(probs, descending=True)
        # Keep the smallest prefix whose mass reaches top_p (the token crossing it included).
        before = torch.cumsum(sorted_probs, dim=-1) - sorted_probs
        sorted_probs = sorted_probs.masked_fill(before >= params.top_p, 0.0)
        probs = torch.zeros_like(probs).scatter_(-1, order, sorted_probs)
        probs = probs / probs.sum()
    return probs


def draw(probs: torch.Tensor, generator: torch.Generator | None) -> int:
    """Inverse-CDF draw of one token: exactly one uniform number consumed per call."""
    uniform = torch.rand((), generator=generator, dtype=torch.float64)
    # On the CPU whatever the logits' device: the generator is a CPU one, and the draw is then
    # the same on every device.
    cdf = torch.cumsum(probs.to("cpu", torch.float64), dim=-1)
    # right=True: the first token whose cumulative mass exceeds the target, so a
    # zero-probability token (flat stretch of the CDF) can never be chosen.
    index = int(torch.searchsorted(cdf, uniform * cdf[-1], right=True))
    if index >= probs.numel():  # round-off at the very top of the CDF
        index = int(torch.nonzero(probs)[-1])
    return index


class TokenChooser:
    """Chooses the token that follows each row of a logits matrix, for one request.

    Mutates: its random generator (sampled mode), one draw per ``choose`` call.
    """

    def __init__(self, params: SamplingParams) -> None:
        self.params = params
        self.generator: torch.Generator | None = None
        if not params.greedy:
            self.generator = torch.Generator()
            self.generator.manual_seed(
                params.seed if params.seed is not None else torch.seed()
            )
        self._argmax: list[int] | None = None
        self._logits: torch.Tensor | None = None

    def bind(self, logits: torch.Tensor) -> None:
        """Use ``logits`` ``[rows, vocab]`` for the following ``choose`` calls."""
        self._logits = logits
        # Greedy choices for all rows in one call: far cheaper than one argmax per row.
        self._argmax = logits.argmax(dim=-1).tolist() if self.params.greedy else None

    def choose(self, row: int) -> int:
        if self._argmax is not None:
            return self._argmax[row]
        if self._logits is None:
            raise RuntimeError("TokenChooser.bind(logits) must be called before choose()")
        return draw(target_distribution(self._logits[row], self.params), self.generator)
