"""Measuring a recurrent LM against a Transformer: the same training loop for both, training tokens/s at
a sequence length, accuracy on the long-range recall task (tformer.data.recall) per distance k, and the
gradient that reaches each earlier position. bench/rnn_vs_transformer.py runs them; any model whose
forward takes (B, T) input_ids and returns ``.logits`` (B, T, V) and whose token embedding is
``tok_embed`` will do (every tformer architecture).
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable

import torch
import torch.nn.functional as F

from tformer.core import fmt
from tformer.data.recall import IGNORE_INDEX, RecallTask, recall_batch

# One optimiser setting for every model trained here: Adam's defaults, no weight decay and no clipping. Measured
# on the 8-token recall task: with gradients clipped at norm 1 the LSTM stayed at chance for 600 steps (with
# AdamW's betas (0.9, 0.99) and decay 0.1 or without them); unclipped it reached 100% in the same steps. The
# Transformer learns either way, so the setting that lets the baseline learn is the fair one.
BETAS, WEIGHT_DECAY = (0.9, 0.999), 0.0


def optimizer_for(model: torch.nn.Module, lr: float) -> torch.optim.Optimizer:
    return torch.optim.AdamW(model.parameters(), lr=lr, betas=BETAS, weight_decay=WEIGHT_DECAY)


def train_steps(model: torch.nn.Module, loss_fn: Callable[[], torch.Tensor], steps: int, lr: float) -> list[float]:
    """``steps`` AdamW steps on ``loss_fn()`` (a fresh batch each call), the learning rate falling from lr to
    lr / 10 on a cosine, gradients not clipped (see BETAS); the loss of every step."""
    optimizer = optimizer_for(model, lr)
    model.train()
    losses = []
    for step in range(steps):
        for group in optimizer.param_groups:
            group["lr"] = lr * (0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * step / steps)))
        loss = loss_fn()
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        optimizer.step()
        losses.append(float(loss.detach()))
    model.eval()
    return losses


def train_tokens_per_s(model: torch.nn.Module, seq: int, tokens: int, steps: int = 2, reps: int = 3,
                       seed: int = 0) -> float:
    """Training tokens per second at sequence length ``seq``: max(1, tokens // seq) rows of random ids, a
    step = forward + backward + AdamW step; best of ``reps`` timings of ``steps`` steps, after one warm-up.
    The weights move (lr 1e-4): timing only, on a copy you do not need afterwards."""
    rows = max(1, tokens // seq)
    vocab = model.config.vocab_size
    ids = torch.randint(0, vocab, (rows, seq), generator=torch.Generator().manual_seed(seed))
    optimizer = optimizer_for(model, 1e-4)
    model.train()

    def step():
        logits = model(ids).logits
        loss = F.cross_entropy(logits.reshape(-1, vocab), ids.reshape(-1))
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        optimizer.step()

    step()
    best = math.inf
    for _ in range(reps):
        start = time.perf_counter()
        for _ in range(steps):
            step()
        best = min(best, (time.perf_counter() - start) / steps)
    model.eval()
    return rows * seq / best


def recall_loss(model: torch.nn.Module, ids: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
    """Mean cross-entropy at the labelled (query) positions: position t's logits predict labels[:, t]."""
    logits = model(ids).logits
    return F.cross_entropy(logits.reshape(-1, logits.shape[-1]), labels.reshape(-1), ignore_index=IGNORE_INDEX)


@torch.no_grad()
def recall_accuracy(model: torch.nn.Module, task: RecallTask, batches: int, rows: int,
                    seed: int) -> dict[int, float]:
    """{k: fraction of queries at distance k answered with the right value (argmax)}, on ``batches``
    batches drawn from a generator seeded with ``seed``."""
    model.eval()
    generator = torch.Generator().manual_seed(seed)
    right = torch.zeros(len(task.distances))
    for _ in range(batches):
        ids, labels, queries = recall_batch(task, rows, generator)
        predicted = model(ids).logits.argmax(-1)
        right += (predicted.gather(1, queries) == labels.gather(1, queries)).float().sum(0)
    return {k: float(r) / (batches * rows) for k, r in zip(task.distances, right)}


def gradient_reach(model: torch.nn.Module, ids: torch.Tensor, targets: torch.Tensor) -> list[float]:
    """norms[d] = ||d loss / d e_t|| at t = n - 1 - d (d = 0 .. n-1), averaged over the rows, where loss is
    the cross-entropy of the last position's logits against ``targets`` (B,) and e_t the token embedding
    at position t (before any position embedding): how much of the last prediction's gradient reaches
    the input d tokens back. ids (B, n); the model's parameters get no gradient."""
    captured = []
    hook = model.tok_embed.register_forward_hook(lambda _m, _inp, out: captured.append(out))
    try:
        logits = model(ids).logits[:, -1]
    finally:
        hook.remove()
    # summed over rows, so each row's gradient is its own loss's (the rows do not interact)
    loss = F.cross_entropy(logits.float(), targets, reduction="sum")
    (grad,) = torch.autograd.grad(loss, captured[0])
    return grad.norm(dim=-1).mean(0).flip(0).tolist()


def log_distances(n: int, per_octave: int = 2) -> list[int]:
    """Distances 0, 1, 2, 3, 4, 6, 8, 11, ... up to n - 1 (about ``per_octave`` per doubling): where a
    gradient-reach curve is kept."""
    out = {0, n - 1}
    i = 0
    while (d := round(2 ** (i / per_octave))) < n:
        out.add(d)
        i += 1
    return sorted(out)


MODELS = ("lstm", "transformer")  # the record's model keys, in the columns' order
SHOWN_DISTANCES = (1, 8, 32, 128, 512)  # gradient-reach rows of the table (the record keeps the whole curve)


def _at(pairs: list, key: int):
    """The value beside ``key`` in a list of [key, value] pairs (None: not there)."""
    return next((v for k, v in pairs if k == key), None)


def comparison_rows(record: dict) -> tuple[list[str], list[list[str]]]:
    """(headers, rows) of the one table bench/rnn_vs_transformer.py prints and the report shows: a row per
    quantity, a column per model. A record missing a part raises KeyError / TypeError (the caller's to say)."""
    models = record["models"]
    rows = [["parameters", *(fmt.count(models[m]["params"]) for m in MODELS)],
            ["validation loss (nats/char)", *(fmt.num(record["val_loss"][m], 4) for m in MODELS)]]
    for i, n in enumerate(record["throughput"]["ns"]):
        per = {m: record["throughput"][m][i] for m in MODELS}
        rows.append([f"train tokens/s, n = {n}", *(fmt.num(per[m]["tokens_per_s"]) for m in MODELS)])
        if i:
            rows.append([f"  time/token vs n = {record['throughput']['ns'][0]} (ledger FLOPs/token)",
                         *(f"{per[m]['growth']:.2f}x ({per[m]['predicted_growth']:.2f}x)" for m in MODELS)])
        rows.append(["  sequential steps (ledger)", *(str(per[m]["sequential_steps"]) for m in MODELS)])
    recall = record["recall"]
    for k in recall["shown"]:
        rows.append([f"recall accuracy, k = {k}", *(fmt.pct(_at(recall[m], k), 0) for m in MODELS)])
    reach = record["gradient_reach"]
    for d in SHOWN_DISTANCES:
        if d in reach["distances"]:
            j = reach["distances"].index(d)
            rows.append([f"|dloss/dx| from {d} back, init -> trained",
                         *(f"{reach[m]['init'][j]:.2g} -> {reach[m]['trained'][j]:.2g}" for m in MODELS)])
    return ["", *MODELS], rows


__all__ = ["BETAS", "MODELS", "SHOWN_DISTANCES", "WEIGHT_DECAY", "comparison_rows", "gradient_reach",
           "log_distances", "optimizer_for", "recall_accuracy", "recall_loss", "train_steps", "train_tokens_per_s"]
