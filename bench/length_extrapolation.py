"""Length extrapolation: char models trained at T=128, evaluated at 128, 256, 512 and 1024.

Every row is the same small char model (char-small scaled down so the whole bench runs in minutes
on two CPU cores), trained from the same seed on the same batches of the shakespeare corpus's
train split for the same steps; only how it knows positions differs:

    learned      a trained table of max_positions rows (GPT-2): nothing exists past row 128
    sinusoidal   the fixed sin/cos table, evaluated with a longer table (it has no parameters)
    rope         rotary positions, evaluated as trained (angles keep growing past 128)
    rope+linear  the rope model's weights, positions divided by (eval length / 128) at evaluation
    alibi        a linear distance penalty on the scores, per head (no positions in the embeddings)
    rope+sliding the rope model's weights with each query attending to the last 128 keys only: at
                 T=128 a 128-key window sees every earlier token, so its training is the rope
                 row's training and the two agree at 128

Validation loss (nats per character) is measured on the same first N validation characters at
every length, cut into non-overlapping windows of that length, every position scored.

    python bench/length_extrapolation.py [--steps 200] [--quick] [--lengths 128 256 512 1024] [--no-save]
"""

from __future__ import annotations

import argparse
import math
import os
import sys
import time

import torch
import torch.nn.functional as F

import tformer
from tformer.core.config import preset
from tformer.core.errors import TformerError
from tformer.data.prepare import prepare
from tformer.model.attention.registry import ATTENTION
from tformer.train.optim import make_optimizer

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import _results  # noqa: E402  (bench/_results.py: the machine header and bench/results/ files)

ROWS = ("learned", "sinusoidal", "rope", "rope+linear", "alibi", "rope+sliding")
TRAINED = {"learned": "learned", "sinusoidal": "sinusoidal", "rope": "rope", "alibi": "alibi"}
SCALED_DOWN = dict(n_layers=2, d_model=128, n_heads=4, d_ff=512)  # char-small: 4 layers, 256, 4 heads, 1024


def model_config(args, position: str):
    sizes = {k: getattr(args, k) for k in SCALED_DOWN}
    return preset("char-small").replace(name=f"extrapolation-{position}", position=position, max_positions=args.seq,
                                        vocab_size=args.vocab_size, **sizes)


def train(args, data, position: str) -> tuple[torch.nn.Module, float]:
    """One model trained from ``args.seed`` on the seed's batches; returns it and its last training loss."""
    torch.manual_seed(args.seed)
    model = tformer.build_model(model_config(args, position)).train()
    optimizer = make_optimizer(model, "adamw", args.lr)
    batches = data.batches("train", args.batch, args.seq, seed=args.seed)
    warmup = max(1, args.steps // 10)
    loss = torch.tensor(float("nan"))
    for step in range(args.steps):
        for group in optimizer.param_groups:  # linear warm-up, then cosine to a tenth
            progress = max(0.0, (step - warmup) / max(1, args.steps - warmup))
            cosine = 0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * progress))
            group["lr"] = args.lr * min(1.0, (step + 1) / warmup) * cosine
        x, y = next(batches)
        logits = model(x).logits
        loss = F.cross_entropy(logits.reshape(-1, logits.shape[-1]), y.reshape(-1))
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
    return model.eval(), loss.item()


def for_length(model, args, length: int, **changes):
    """``model``'s weights in a model whose config reaches ``length`` positions (plus ``changes``)."""
    config = model.config.replace(max_positions=max(length, args.seq), **changes)
    out = tformer.build_model(config).eval()
    out.load_state_dict(model.state_dict())
    return out


def validation_loss(model, tokens: torch.Tensor, length: int, batch: int) -> float:
    """Mean cross-entropy over every position of the windows of ``length`` cut from ``tokens``."""
    windows = tokens[: len(tokens) - (len(tokens) - 1) % length - 1].view(-1, length)
    targets = tokens[1: 1 + windows.numel()].view(-1, length)
    total, count = 0.0, 0
    with torch.no_grad():
        for i in range(0, len(windows), batch):
            logits = model(windows[i:i + batch]).logits
            total += F.cross_entropy(logits.reshape(-1, logits.shape[-1]), targets[i:i + batch].reshape(-1),
                                     reduction="sum").item()
            count += targets[i:i + batch].numel()
    return total / count


def row_models(row: str, trained: dict, args, length: int):
    """The model evaluated in ``row`` at ``length``, or the reason there is none."""
    if row == "learned":
        return trained["learned"] if length <= args.seq else f"n/a (table holds {args.seq})"
    if row == "rope+linear":
        return for_length(trained["rope"], args, length, rope_scaling="linear" if length > args.seq else "none",
                          rope_factor=max(1.0, length / args.seq))
    if row == "rope+sliding":
        return for_length(trained["rope"], args, length, attn_impl="sliding", attn_window=args.seq)
    return for_length(trained[row], args, length)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--steps", type=int, default=200, help="training steps per model (default 200)")
    parser.add_argument("--quick", action="store_true", help="60 steps and 8192 evaluation characters")
    parser.add_argument("--lengths", type=int, nargs="+", default=[128, 256, 512, 1024])
    parser.add_argument("--seq", type=int, default=128, help="training length (default 128)")
    parser.add_argument("--batch", type=int, default=16)
    parser.add_argument("--lr", type=float, default=2e-3)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--eval-chars", type=int, default=16384, help="validation characters scored per length")
    parser.add_argument("--data", default="shakespeare", help="corpus name or local text file (char tokens)")
    for name, value in SCALED_DOWN.items():
        parser.add_argument(f"--{name.replace('_', '-')}", type=int, default=value)
    parser.add_argument("--no-save", action="store_true", help="do not file the figures under bench/results/")
    args = parser.parse_args(argv)
    if args.quick:
        args.steps, args.eval_chars = 60, 8192

    machine = _results.machine()
    print(_results.header(machine))
    data = prepare(args.data, "char")
    args.vocab_size = data.vocab_size
    tokens = torch.from_numpy(data["validation"].tokens[: args.eval_chars + 1].astype("int64"))
    if len(tokens) <= max(args.lengths):
        raise TformerError(f"the validation split has {len(tokens)} characters, fewer than the longest length "
                           f"{max(args.lengths)}; use shorter --lengths or a larger corpus")
    params = sum(p.numel() for p in tformer.build_model(model_config(args, "rope")).parameters())
    print(f"char model: {args.n_layers} layers, d_model {args.d_model}, {args.n_heads} heads, d_ff {args.d_ff} "
          f"({params / 1e6:.2f} M parameters; char-small is 4 layers, 256, 4 heads, 1024), trained at T={args.seq} "
          f"on {args.data} for {args.steps} steps of batch {args.batch}, AdamW lr {args.lr}, seed {args.seed}, "
          f"{torch.get_num_threads()} threads")
    print(f"validation loss (nats/char) on the first {len(tokens) - 1} validation characters in windows of each length")

    trained, train_loss, started = {}, {}, time.perf_counter()
    for row, position in TRAINED.items():
        begin = time.perf_counter()
        trained[row], train_loss[row] = train(args, data, position)
        print(f"  trained {row:<10} last train loss {train_loss[row]:.3f} in {time.perf_counter() - begin:.0f} s")
    rows = list(ROWS)
    if "sliding" not in ATTENTION:
        rows.remove("rope+sliding")
        print("  rope+sliding skipped: this tformer has no 'sliding' attention kind in tformer.model.attention yet")

    width = max(22, *(len(str(n)) + 2 for n in args.lengths))
    print(f"{'positions':<14}" + "".join(f"{n:>{width}}" for n in args.lengths))
    table = {}
    for row in rows:
        cells = []
        for length in args.lengths:
            model = row_models(row, trained, args, length)
            cells.append(model if isinstance(model, str) else round(validation_loss(model, tokens, length, 8), 4))
        table[row] = dict(zip(map(str, args.lengths), cells))
        print(f"{row:<14}" + "".join(f"{c if isinstance(c, str) else f'{c:.3f}':>{width}}" for c in cells))
    print(f"  total {time.perf_counter() - started:.0f} s")

    record = {"steps": args.steps, "seq": args.seq, "batch": args.batch, "lr": args.lr, "seed": args.seed,
              "model": {k: getattr(args, k) for k in SCALED_DOWN} | {"parameters": params}, "data": args.data,
              "eval_chars": len(tokens) - 1, "train_loss": train_loss, "validation_loss": table}
    if not args.no_save:
        print(f"  saved in {_results.save('length_extrapolation', record, machine)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
