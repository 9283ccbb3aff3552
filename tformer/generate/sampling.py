"""Logits processors: each a small pure function from (B, V) logits to (B, V) logits.

A processor never changes its input in place, and each checks its own argument, so a bad value
(top_p=1.5, temperature=-1) is reported by name before any compute is spent. Removed tokens get
-inf, so softmax gives them probability exactly zero.

The order follows common practice (and Hugging Face's): repetition penalty on the raw logits,
then temperature, then the truncations (top-k, top-p, min-p), which look at the tempered
distribution.

``Sampling`` is the one record of these settings and the one token pick: generate (tformer.generate.search)
makes one from its GenerationConfig, the serving batcher (tformer.generate.continuous) holds one per request.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch

from tformer.core.errors import TformerError

NEG_INF = float("-inf")


# Validation --------------------------------------------------------------------------------
def check_temperature(temperature: float) -> float:
    """Temperature must be > 0; 0 is accepted by `generate` and means greedy (argmax), see there."""
    if not isinstance(temperature, (int, float)) or isinstance(temperature, bool) or math.isnan(temperature):
        raise TformerError(f"temperature must be a number, got {temperature!r}")
    if temperature < 0:
        raise TformerError(f"temperature must be positive (0 means greedy), got {temperature}")
    if math.isinf(temperature):  # logits / inf is 0 for every token and NaN for a masked one
        raise TformerError("temperature must be finite; for uniform sampling use a large value such as 1e6")
    return float(temperature)


def check_top_k(top_k: int) -> int:
    if isinstance(top_k, bool) or not isinstance(top_k, int) or top_k < 0:
        raise TformerError(f"top_k must be a whole number >= 0 (0 turns it off), got {top_k!r}")
    return top_k


def check_top_p(top_p: float) -> float:
    if not isinstance(top_p, (int, float)) or isinstance(top_p, bool) or not 0.0 < top_p <= 1.0:
        raise TformerError(f"top_p must be in (0, 1] (1 turns it off), got {top_p!r}")
    return float(top_p)


def check_min_p(min_p: float) -> float:
    if not isinstance(min_p, (int, float)) or isinstance(min_p, bool) or not 0.0 <= min_p <= 1.0:
        raise TformerError(f"min_p must be in [0, 1] (0 turns it off), got {min_p!r}")
    return float(min_p)


def check_repetition_penalty(penalty: float) -> float:
    if not isinstance(penalty, (int, float)) or isinstance(penalty, bool) or not 0 < penalty < math.inf:
        raise TformerError(f"repetition_penalty must be positive and finite (1 turns it off), got {penalty!r}")
    return float(penalty)


# Processors ----------------------------------------------------------------------------------
def apply_temperature(logits: torch.Tensor, temperature: float) -> torch.Tensor:
    """softmax(logits / T): T < 1 sharpens the distribution, T > 1 flattens it."""
    temperature = check_temperature(temperature)
    if temperature == 0:
        raise TformerError("temperature 0 is greedy decoding; take the argmax instead of sampling")
    if temperature == 1.0:
        return logits
    scaled = logits / temperature
    if temperature < 1.0 and not bool(torch.isfinite(scaled.amax(dim=-1)).all()):
        # A tiny temperature overflows the division to inf (or rounds to 0 in float32: 0/0 is NaN),
        # and softmax of inf is NaN. Shifting each row's top logit to 0 first, and keeping it 0,
        # gives the same distribution with finite values (the shift is skipped otherwise, so
        # ordinary temperatures keep their exact arithmetic).
        shifted = logits - logits.amax(dim=-1, keepdim=True)
        scaled = torch.where(shifted == 0, shifted, shifted / temperature)
    return scaled


def top_k_filter(logits: torch.Tensor, top_k: int) -> torch.Tensor:
    """Keep the k highest logits of each row (ties with the k-th are kept too); 0 = keep all."""
    top_k = check_top_k(top_k)
    if top_k == 0 or top_k >= logits.shape[-1]:
        return logits
    kth = torch.topk(logits, top_k, dim=-1).values[..., -1:]
    return logits.masked_fill(logits < kth, NEG_INF)


def top_p_filter(logits: torch.Tensor, top_p: float) -> torch.Tensor:
    """Nucleus sampling (Holtzman et al. 2019): keep the smallest set of most likely tokens whose
    probability adds up to at least top_p. The most likely token is always kept."""
    top_p = check_top_p(top_p)
    if top_p == 1.0:
        return logits
    sorted_logits, order = torch.sort(logits, dim=-1, descending=True)
    probs = torch.softmax(sorted_logits, dim=-1)
    # Mass of the tokens strictly before each one: a token is needed while that mass is < top_p.
    before = torch.cumsum(probs, dim=-1) - probs
    remove_sorted = before >= top_p
    remove_sorted[..., 0] = False
    remove = remove_sorted.scatter(-1, order, remove_sorted)  # back to vocabulary order
    return logits.masked_fill(remove, NEG_INF)


def min_p_filter(logits: torch.Tensor, min_p: float) -> torch.Tensor:
    """Min-p (Nguyen et al. 2024): keep tokens whose probability is >= min_p x the top token's,
    so the cut adapts to how confident the model is. 0 = keep all."""
    min_p = check_min_p(min_p)
    if min_p == 0.0:
        return logits
    probs = torch.softmax(logits, dim=-1)
    threshold = min_p * probs.max(dim=-1, keepdim=True).values
    return logits.masked_fill(probs < threshold, NEG_INF)


def repetition_penalty(logits: torch.Tensor, seen: torch.Tensor, penalty: float) -> torch.Tensor:
    """Make tokens already in the text less likely (Keskar et al. 2019, CTRL).

    ``seen``: (B, V) bool, True for tokens that occur in the sequence so far. Their logit is
    divided by ``penalty`` when positive and multiplied when negative, so penalty > 1 always
    lowers them (dividing a negative logit would raise it).
    """
    penalty = check_repetition_penalty(penalty)
    if penalty == 1.0:
        return logits
    penalised = torch.where(logits > 0, logits / penalty, logits * penalty)
    # A tiny penalty overflows a division to inf, and softmax of inf is NaN; the largest finite value
    # keeps the limit it stands for (that token is certain).
    big = torch.finfo(penalised.dtype).max
    penalised = penalised.clamp(-big, big)
    return torch.where(seen, penalised, logits)


def seen_tokens(ids: torch.Tensor, vocab_size: int, mask: torch.Tensor | None = None) -> torch.Tensor:
    """(B, T) ids -> (B, V) bool "this token occurs"; positions where mask is 0 (padding) do not count."""
    if mask is not None:  # padding writes into a spare last column, dropped at the end
        ids = ids.masked_fill(~mask.bool(), vocab_size)
    seen = torch.zeros(ids.shape[0], vocab_size + 1, dtype=torch.bool, device=ids.device)
    seen.scatter_(1, ids, True)
    return seen[:, :vocab_size]


def process_logits(logits: torch.Tensor, *, temperature: float = 1.0, top_k: int = 0, top_p: float = 1.0,
                   min_p: float = 0.0, penalty: float = 1.0, seen: torch.Tensor | None = None) -> torch.Tensor:
    """Apply the processors in the usual order; (B, V) -> (B, V) with removed tokens at -inf."""
    if penalty != 1.0 and seen is not None:
        logits = repetition_penalty(logits, seen, penalty)
    logits = apply_temperature(logits, temperature)
    logits = top_k_filter(logits, top_k)
    logits = top_p_filter(logits, top_p)
    return min_p_filter(logits, min_p)


def sample(logits: torch.Tensor, generator: torch.Generator | None = None) -> torch.Tensor:
    """One token per row from softmax(logits); ``generator`` makes it reproducible. (B, V) -> (B,)."""
    probs = torch.softmax(logits.float(), dim=-1)
    return torch.multinomial(probs, 1, generator=generator).squeeze(-1)


@dataclass(frozen=True)
class Sampling:
    """How the next token of a row is picked: the argmax (temperature 0, the default) or a draw from the
    distribution after the processors above, in their order."""

    temperature: float = 0.0  # 0 = greedy (argmax)
    top_k: int = 0  # 0 = off
    top_p: float = 1.0  # in (0, 1]; 1 = off
    min_p: float = 0.0  # in [0, 1]; 0 = off
    repetition_penalty: float = 1.0  # > 0; 1 = off

    def validate(self) -> "Sampling":
        """Each setting checked by name (a TformerError naming the first bad one); returns self."""
        check_temperature(self.temperature)
        check_top_k(self.top_k)
        check_top_p(self.top_p)
        check_min_p(self.min_p)
        check_repetition_penalty(self.repetition_penalty)
        return self

    @property
    def greedy(self) -> bool:
        return self.temperature == 0

    def pick(self, logits: torch.Tensor, generator: torch.Generator | None = None,
             seen: torch.Tensor | None = None) -> torch.Tensor:
        """(B, V) logits -> (B,) token ids. ``seen`` (B, V) bool: the tokens the repetition penalty looks at
        (the text so far); ``generator`` makes the draws reproducible."""
        logits = logits.float()
        if seen is not None and self.repetition_penalty != 1.0:
            logits = repetition_penalty(logits, seen, self.repetition_penalty)
        if self.greedy:
            return logits.argmax(dim=-1)
        logits = process_logits(logits, temperature=self.temperature, top_k=self.top_k, top_p=self.top_p,
                                min_p=self.min_p)
        return sample(logits, generator)
