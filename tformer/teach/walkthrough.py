"""Scaled dot-product attention, one step at a time, through the library's own code.

The output and the weights come from ``tformer.model.attention.reference.reference`` — the
function the models run — with scale 1/√d_k and the mask from ``build_mask``. The intermediate
steps it does not return (Q Kᵀ, the scaled and masked scores) are recomputed here the same way,
and the softmax of those steps is checked to equal the function's weights bit for bit, so the
numbers a student checks by hand are the numbers the code produced. Everything runs in float64 so
the printed and JSON values are exact to the last digit a student would care about.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch

from tformer.model.attention.reference import reference
from tformer.model.masks import build_mask, causal_mask
from tformer.teach.examples import Example, validate

DTYPE = torch.float64


@dataclass
class HeadSteps:
    """One head's matrices, each (T, ·); 'scaled' already has -inf where the causal mask hides a key."""

    Q: torch.Tensor  # (T, d_k)
    K: torch.Tensor  # (T, d_k)
    V: torch.Tensor  # (T, d_v)
    scores: torch.Tensor  # Q Kᵀ, (T, T)
    scaled: torch.Tensor  # Q Kᵀ · (1/√d_k), masked entries -inf
    weights: torch.Tensor  # softmax of each row of `scaled`
    output: torch.Tensor  # weights V, (T, d_v)


@dataclass
class Walkthrough:
    example: Example
    heads: int
    causal: bool
    d_k: int
    d_v: int
    scale: float  # 1/√d_k, what the library multiplies the scores by
    allowed: torch.Tensor  # (T, T) bool: may query i see key j
    X: torch.Tensor
    Q: torch.Tensor  # X W_Q, all heads side by side (T, heads·d_k)
    K: torch.Tensor
    V: torch.Tensor
    per_head: list[HeadSteps]
    concat: torch.Tensor  # (T, heads·d_v): the heads' outputs side by side
    output: torch.Tensor  # concat W_O, or concat when there is no W_O

    @property
    def tokens(self) -> list[str]:
        return self.example.tokens

    def strongest(self, head: int) -> list[tuple[list[int], float]]:
        """Per query: the key positions sharing the largest weight (ties kept) and that weight."""
        out = []
        for row in self.per_head[head].weights.tolist():
            top = max(row)
            # rows of a float softmax can differ from an exact tie in the last bit
            out.append(([j for j, w in enumerate(row) if top - w <= 1e-12], top))
        return out


def run(example: Example, heads: int = 1, causal: bool = False) -> Walkthrough:
    d_k, d_v = validate(example, heads)
    T = len(example.X)
    X = torch.tensor(example.X, dtype=DTYPE)
    W_Q, W_K, W_V = (torch.tensor(w, dtype=DTYPE) for w in (example.W_Q, example.W_K, example.W_V))
    Q, K, V = X @ W_Q, X @ W_K, X @ W_V

    # The model's layout: (batch, heads, T, d); head h owns columns h·d .. (h+1)·d - 1 of a
    # projection, exactly as MultiHeadAttention._heads splits q_proj's output.
    def split(m: torch.Tensor, width: int) -> torch.Tensor:
        return m.view(T, heads, width).transpose(0, 1).unsqueeze(0)

    q, k, v = split(Q, d_k), split(K, d_k), split(V, d_v)
    scale = 1.0 / math.sqrt(d_k)
    mask = build_mask(T, T, causal=causal, dtype=DTYPE)
    out, weights = reference(q, k, v, mask, scale)

    # The steps inside reference(), redone in the same order with the same operations.
    allowed = causal_mask(T, T) if causal else torch.ones(T, T, dtype=torch.bool)
    scores = q @ k.transpose(-2, -1)
    scaled = (scores * scale).masked_fill(~allowed, float("-inf"))
    mine = torch.softmax(scaled, dim=-1)
    if not (torch.equal(mine, weights) and torch.equal(mine @ v, out)):
        # A bug, not bad input: the walkthrough would be teaching numbers the model does not compute.
        raise RuntimeError("walkthrough steps disagree with attention.reference(); update tformer/teach/walkthrough.py")

    per_head = [HeadSteps(q[0, h], k[0, h], v[0, h], scores[0, h], scaled[0, h], weights[0, h], out[0, h])
                for h in range(heads)]
    concat = out[0].transpose(0, 1).reshape(T, heads * d_v)  # as the model concatenates heads
    output = concat @ torch.tensor(example.W_O, dtype=DTYPE) if example.W_O is not None else concat
    return Walkthrough(example, heads, causal, d_k, d_v, scale, allowed, X, Q, K, V, per_head, concat, output)


def _plain(m: torch.Tensor):
    """Exact float64 values; a masked -inf becomes null, since JSON has no infinity."""
    return [[None if math.isinf(x) else x for x in row] for row in m.tolist()]


def to_dict(w: Walkthrough) -> dict:
    ex = w.example
    return {
        "tokens": ex.tokens,
        "source": ex.source,
        "heads": w.heads,
        "causal": w.causal,
        "d_model": len(ex.X[0]),
        "d_k": w.d_k,
        "d_v": w.d_v,
        "scale": w.scale,
        "note": "scaled = scores * scale with scale = 1/sqrt(d_k); masked entries (-inf) are null; "
                "weights = softmax(scaled) per row; output = weights V; final output = concat W_O",
        "X": ex.X, "W_Q": ex.W_Q, "W_K": ex.W_K, "W_V": ex.W_V, "W_O": ex.W_O,
        "Q": _plain(w.Q), "K": _plain(w.K), "V": _plain(w.V),
        "allowed": w.allowed.tolist(),
        "per_head": [
            {"Q": _plain(h.Q), "K": _plain(h.K), "V": _plain(h.V), "scores": _plain(h.scores),
             "scaled": _plain(h.scaled), "weights": _plain(h.weights), "output": _plain(h.output),
             "strongest": [{"query": ex.tokens[i], "keys": [ex.tokens[j] for j in keys], "weight": top}
                           for i, (keys, top) in enumerate(w.strongest(n))]}
            for n, h in enumerate(w.per_head)
        ],
        "concat": _plain(w.concat),
        "output": _plain(w.output),
    }
