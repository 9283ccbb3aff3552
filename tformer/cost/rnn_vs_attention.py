"""An LSTM and a Transformer of equal size, and what the ledger predicts for each as the sequence grows
(no torch): the pair bench/rnn_vs_transformer.py trains and the report's "Why attention" section costs.

The Transformer is fixed (a small decoder); the LSTM's hidden width is solved for with the ledger's
parameter count, which grows monotonically with d_hidden, so a bisection lands on the closest width:

    LSTM params(h) = V d (embedding) + sum over layers 4((d_in + h)h + 2h) + h V (head, untied when h != d)

The growth with n (the textbook's complexity theorem, per token of a training step):

    Transformer  FLOPs/token = O(L d^2) + O(L n d)   (the n^2 score matrix over n tokens)   L steps in sequence
    LSTM         FLOPs/token = O(L d^2), flat in n                                           L n steps in sequence
"""

from __future__ import annotations

from tformer.core.config import ModelConfig, preset
from tformer.core.errors import TformerError
from tformer.cost.ledger import Workload, ledger
from tformer.cost.recurrent import sequential_steps

TRANSFORMER = {"n_layers": 4, "d_model": 128, "n_heads": 4, "d_ff": 512, "dropout": 0.0, "attention_dropout": 0.0}
RNN_LAYERS = 2
MAX_POSITIONS = 1024  # the longest sequence either model is timed or trained at
TOLERANCE = 0.02  # equal size: within 2% of the Transformer's parameters
NS = (64, 128, 256, 512, 1024)


def param_count(config: ModelConfig) -> int:
    """Every parameter once (a tied head counted once), as the ledger counts it."""
    return ledger(config, Workload(phase="forward", batch=1, seq=1)).params["total"]


def transformer_config(vocab_size: int, max_positions: int = MAX_POSITIONS, **overrides) -> ModelConfig:
    """The reference decoder (TRANSFORMER, learned positions up to ``max_positions``)."""
    return preset("char-small").replace(**{**TRANSFORMER, "vocab_size": vocab_size, "max_positions": max_positions,
                                           **overrides})


def matched_rnn(reference: ModelConfig, cell: str = "lstm", n_layers: int = RNN_LAYERS,
                d_model: int | None = None) -> ModelConfig:
    """The arch='rnn' config with ``reference``'s vocabulary, embedding width (or ``d_model``) and context
    whose d_hidden makes its parameter count closest to ``reference``'s (the ledger's counts, bisected);
    a TformerError when even the closest is more than TOLERANCE away."""
    target = param_count(reference)
    d = d_model or reference.d_model

    def make(h: int) -> ModelConfig:
        return ModelConfig(arch="rnn", cell=cell, vocab_size=reference.vocab_size, d_model=d, d_hidden=h,
                           n_layers=n_layers, max_positions=reference.max_positions, dropout=0.0)

    lo, hi = 1, 1
    while param_count(make(hi)) < target:
        lo, hi = hi, hi * 2
    while hi - lo > 1:  # param_count(make(lo)) < target <= param_count(make(hi))
        mid = (lo + hi) // 2
        lo, hi = (mid, hi) if param_count(make(mid)) < target else (lo, mid)
    best = min((make(lo), make(hi)), key=lambda c: abs(param_count(c) - target))
    gap = relative_gap(param_count(best), target)
    if gap > TOLERANCE:
        raise TformerError(f"no {n_layers}-layer {cell} with d_model {d} comes within {TOLERANCE:.0%} of "
                           f"{target} parameters (closest {gap:.1%} off); change n_layers or d_model")
    return best


def relative_gap(a: int, b: int) -> float:
    return abs(a - b) / b


def model_pair(vocab_size: int, max_positions: int = MAX_POSITIONS, cell: str = "lstm") -> dict[str, ModelConfig]:
    """{"lstm": ..., "transformer": ...}: the reference decoder and the recurrent LM of equal size."""
    t = transformer_config(vocab_size, max_positions)
    return {cell: matched_rnn(t, cell), "transformer": t}


def predicted_growth(config: ModelConfig, ns=NS) -> list[dict]:
    """Per n: the ledger's FLOPs per token of a training step (one sequence of n tokens), that figure over
    its value at the first n, and the steps the forward pass takes one after another (layer after layer;
    a recurrent layer n of them, an attention layer 1)."""
    config = config.replace(max_positions=max(max(ns), config.max_positions))
    recurrent = config.arch == "rnn"
    rows = []
    for n in ns:
        per_token = ledger(config, Workload(phase="train", batch=1, seq=n)).flops["total"] / n
        rows.append({"n": n, "flops_per_token": per_token,
                     "sequential_steps": config.n_layers * sequential_steps(recurrent, n)})
    for r in rows:
        r["growth"] = r["flops_per_token"] / rows[0]["flops_per_token"]
    return rows


__all__ = ["MAX_POSITIONS", "NS", "RNN_LAYERS", "TOLERANCE", "TRANSFORMER", "matched_rnn", "model_pair",
           "param_count", "predicted_growth", "relative_gap", "transformer_config"]
