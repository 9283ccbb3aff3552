"""Chunked cross-entropy for a large vocabulary: the peak memory of one training step with the whole (tokens x V)
logits and with them formed a chunk of rows at a time (`tformer train --loss-chunk N`), predicted by the ledger and
measured, side by side, with the time per step (the chunked backward runs the head's matmul once more).

    python bench/chunked_loss.py                        # d 64, V 65,536, 2 x 512 tokens, chunks 0 (plain), 256, 64
    python bench/chunked_loss.py --vocab 262144 --chunks 0,128   # Gemma 3's vocabulary (about 4 GB for the plain path)
    python bench/chunked_loss.py --quick                # V 16,384, 1 x 256 tokens, a few seconds

A small d and a large V make the logits the largest tensors of the step, as they are for a small model of a large
vocabulary (Gemma 3 270M: d 640, V 262,144).

Measured peak: the tensor bytes alive before a step (weights, AdamW's moments) plus the peak of what the step
allocates above them (tformer.measure.memory_peak: every tensor the forward, backward and optimizer step create, on
the CPU; the weights' gradients included). Predicted: the ledger's training memory (weights + gradients + optimizer
state + activations + logits; tformer.cost.memory) for the same workload and loss_chunk, and its (tokens x V) part:
the logits and what the loss keeps (cost.memory.vocabulary_bytes). The ledger counts what is kept for the backward;
the plain path's measured peak also holds, for a moment, the logits' gradient beside the log-probabilities, which no
resident-memory count includes, so the plain row's measured figure sits above its prediction by about one
(tokens x V) fp32 tensor. fp32 throughout (the ledger's bf16 recipe has 16-bit weights, autocast keeps fp32 ones).
"""
from __future__ import annotations

import argparse
import os
import statistics
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import _results  # noqa: E402  (bench/_results.py)
import torch  # noqa: E402

from tformer.core.config import ModelConfig  # noqa: E402
from tformer.cost.ledger import Workload, ledger  # noqa: E402
from tformer.cost.memory import vocabulary_bytes  # noqa: E402
from tformer.data.batch import example_batch  # noqa: E402
from tformer.measure.memory_peak import PeakTensorMemory  # noqa: E402
from tformer.model import build  # noqa: E402
from tformer.model.runners import runner_for  # noqa: E402

WARM_STEPS = 2  # the first steps create AdamW's moments and pay one-off costs; not timed


def live_bytes(model, optimizer) -> int:
    tensors = {id(p): p for p in model.parameters()}
    for state in optimizer.state.values():
        tensors.update({id(t): t for t in state.values() if isinstance(t, torch.Tensor)})
    return sum(t.numel() * t.element_size() for t in tensors.values())


def bench_row(config, batch: int, seq: int, chunk: int, steps: int) -> dict:
    torch.manual_seed(0)
    model = build(config).train()
    runner = runner_for(model)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    ids = torch.randint(0, config.vocab_size, (batch, seq), generator=torch.Generator().manual_seed(0))
    data = example_batch(config, ids)

    def step() -> float:
        loss = runner.loss(data, chunk=chunk)
        loss.backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        return loss.item()

    for _ in range(WARM_STEPS):
        step()
    before = live_bytes(model, optimizer)
    with PeakTensorMemory() as peak:
        loss = step()
    times = []
    for _ in range(steps):
        start = time.perf_counter()
        step()
        times.append(time.perf_counter() - start)
    lg = ledger(config, Workload(phase="train", batch=batch, seq=seq, loss_chunk=chunk))
    return {"chunk": chunk, "loss": loss, "predicted_peak_bytes": lg.memory["total"],
            "measured_peak_bytes": before + peak.peak, "predicted_logits_and_loss_bytes": vocabulary_bytes(lg),
            "predicted_logits_bytes": lg.memory["logits"], "step_s": statistics.median(times)}


def _mb(n: int) -> str:
    return f"{n / 1e6:,.1f} MB"


def table_rows(records: list[dict]) -> list[list[str]]:
    plain = next((r for r in records if r["chunk"] == 0), records[0])
    return [["whole logits" if r["chunk"] == 0 else f"{r['chunk']:,} rows", _mb(r["predicted_logits_and_loss_bytes"]),
             _mb(r["predicted_peak_bytes"]), _mb(r["measured_peak_bytes"]),
             f"{r['measured_peak_bytes'] / r['predicted_peak_bytes']:.2f}", f"{r['step_s'] * 1000:,.0f} ms",
             f"{r['loss'] - plain['loss']:+.1e}"] for r in records]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--d-model", type=int, default=64)
    parser.add_argument("--vocab", type=int, default=65536)
    parser.add_argument("--layers", type=int, default=2)
    parser.add_argument("--batch", type=int, default=2)
    parser.add_argument("--seq", type=int, default=512)
    parser.add_argument("--chunks", default="0,256,64", help="rows per chunk, comma-separated; 0 = the plain path")
    parser.add_argument("--steps", type=int, default=5, help="timed steps per row (default 5)")
    parser.add_argument("--quick", action="store_true", help="V 16,384, 1 x 256 tokens, 3 timed steps")
    _results.add_run_args(parser)
    args = parser.parse_args(argv)
    if args.quick:
        args.vocab, args.batch, args.seq, args.steps = 16384, 1, 256, 3
    chunks = [int(c) for c in args.chunks.split(",")]
    if any(c < 0 for c in chunks) or args.steps < 1:
        parser.error("--chunks are 0 or more rows each, --steps at least 1")
    if args.threads:
        torch.set_num_threads(args.threads)
    torch.set_flush_denormal(True)
    m = _results.machine()
    print(_results.header(m))
    config = ModelConfig(arch="decoder", n_layers=args.layers, d_model=args.d_model, n_heads=4, d_ff=4 * args.d_model,
                         vocab_size=args.vocab, max_positions=args.seq, dropout=0.0, name="chunked-loss-bench")
    records = [bench_row(config, args.batch, args.seq, c, args.steps) for c in chunks]
    print(f"\ndecoder d {args.d_model}, {args.layers} layers, V {args.vocab:,} (tied head), {args.batch} x {args.seq} "
          f"tokens, fp32 AdamW; peak memory of one training step")
    print(_results.table(["loss", "logits + loss (predicted)", "step peak predicted", "measured", "measured/predicted",
                          "time/step", "loss - plain"], table_rows(records)))
    record = {"d_model": args.d_model, "vocab": args.vocab, "layers": args.layers, "batch": args.batch,
              "seq": args.seq, "rows": records}
    _results.write("chunked_loss", record, m, args.json, not args.no_save)
    return 0


if __name__ == "__main__":
    sys.exit(main())
