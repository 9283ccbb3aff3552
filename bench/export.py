"""ONNX export: ONNX Runtime against PyTorch eager on the same model, the export's time and file size.

    python bench/export.py                       # bert-base and gpt2 (random weights), ~5 minutes on 2 cores
    python bench/export.py --models gpt2 --batches 1 --lengths 32 --repeats 3 --json export.json

What is measured (CPU, fp32, random weights: speed does not depend on the values):
  1. the export: `tformer.interop.onnx_export.export_onnx` (torch.onnx's dynamo exporter, dynamic batch and
     sequence axes) wall time, model.onnx's size, and its own check (ONNX Runtime vs PyTorch, max |difference|).
  2. one forward pass at batch 1 and 8, lengths 32 and 128 (bert-base: input_ids, attention_mask,
     token_type_ids -> hidden states and pooler; gpt2: input_ids, attention_mask -> logits over the vocabulary),
     PyTorch eager under no_grad vs an ONNX Runtime CPU session with graph optimisations on. Both use the same
     threads (default: every core: torch.set_num_threads and ORT's intra-op threads, not spinning when idle). The two alternate within
     each repeat, so machine noise hits both; the median repeat is kept, after one untimed warm-up each.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time

import torch

from tformer.core.config import preset
from tformer.interop.onnx_export import export_onnx, ort_session, run_onnx, sample_inputs
from tformer.model import build

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import _results  # noqa: E402  (bench/_results.py: the machine header and bench/results/ files)


def timed(fn) -> float:
    start = time.perf_counter()
    fn()
    return time.perf_counter() - start


def compare(model, session, batch: int, length: int, repeats: int) -> tuple[float, float]:
    """(median eager seconds, median ONNX Runtime seconds) for one forward pass at batch x length."""
    inputs = sample_inputs(model, batch, length)
    inputs["attention_mask"] = torch.ones_like(inputs["attention_mask"])  # full rows: the common serving case

    def eager():
        with torch.no_grad():
            model(**inputs)

    def ort():
        run_onnx(session, inputs)

    eager(), ort()  # warm-up: allocator, ORT's first-run kernel choices
    pairs = [(timed(eager), timed(ort)) for _ in range(repeats)]
    return statistics.median(p[0] for p in pairs), statistics.median(p[1] for p in pairs)


def bench_model(name: str, overrides: list[str], batches, lengths, repeats: int, threads: int, folder: str) -> dict:
    torch.manual_seed(0)
    model = build(preset(name).with_overrides(overrides)).eval()
    result = export_onnx(model, os.path.join(folder, name))
    session = ort_session(result.path, threads, spin=False)
    rows = []
    for batch in batches:
        for length in lengths:
            eager, ort = compare(model, session, batch, length, repeats)
            rows.append({"batch": batch, "length": length, "eager_s": eager, "ort_s": ort, "speedup": eager / ort})
    return {"model": name, "parameters": model.num_parameters(), "export_s": result.seconds,
            "onnx_bytes": result.bytes, "opset": result.opset, "max_difference": result.max_difference, "shapes": rows}


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--models", default="bert-base,gpt2")
    p.add_argument("--batches", default="1,8")
    p.add_argument("--lengths", default="32,128")
    p.add_argument("--repeats", type=int, default=5)
    p.add_argument("--threads", type=int, default=os.cpu_count() or 1,
                   help="threads for both PyTorch and ONNX Runtime (default: every core)")
    p.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                   help="override a config field of every model (a smaller model for a quick run)")
    p.add_argument("--json", default=None, metavar="FILE")
    p.add_argument("--no-save", action="store_true", help="do not file the figures under bench/results/")
    args = p.parse_args(argv)
    torch.set_num_threads(args.threads)
    machine = _results.machine()
    print(_results.header(machine))
    batches = [int(b) for b in args.batches.split(",")]
    lengths = [int(n) for n in args.lengths.split(",")]
    records = []
    with tempfile.TemporaryDirectory(prefix="tformer-onnx-bench-") as folder:
        for name in [m for m in args.models.split(",") if m]:
            records.append(bench_model(name, args.set, batches, lengths, args.repeats, args.threads, folder))
    rows = []
    for r in records:
        for s in r["shapes"]:
            rows.append([r["model"], f"{r['parameters'] / 1e6:.1f}M", f"{r['export_s']:.1f}",
                         f"{r['onnx_bytes'] / 1e6:.0f}", f"{r['max_difference']:.1e}", str(s["batch"]),
                         str(s["length"]), f"{s['eager_s'] * 1e3:.1f}", f"{s['ort_s'] * 1e3:.1f}",
                         f"{s['speedup']:.2f}x"])
    print(f"\nONNX Runtime vs PyTorch eager, one forward pass, {args.threads} threads each, "
          f"median of {args.repeats} repeats (fp32, random init)")
    print(_results.table(["model", "params", "export s", "onnx MB", "max |diff|", "batch", "length", "eager ms",
                          "ORT ms", "ORT speed-up"], rows))
    _results.write("export", {"threads": args.threads, "repeats": args.repeats, "models": records}, machine,
                   args.json, not args.no_save)
    return 0


if __name__ == "__main__":
    sys.exit(main())
