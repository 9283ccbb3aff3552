"""The README's performance table, from every CPU's file under bench/results/ (written by
decode_speed.py and train_throughput.py): one row per CPU that has been measured.

    python bench/results_table.py
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

RESULTS = Path(__file__).resolve().parent / "results"


def _decode(doc: dict, model: str, batch: int) -> dict | None:
    rows = doc.get("decode_speed", {}).get("decode", [])
    return next((r for r in rows if r["model"] == model and r["batch"] == batch and r["cache"]), None)


def _decode_cell(r: dict | None) -> str:
    if r is None:
        return "-"
    roof = r.get("read_roofline_tokens_per_s")
    share = f", {r['ours_tokens_per_s'] / roof:.0%} of roofline" if roof else ""
    compiled = ""
    if r.get("compiled_tokens_per_s"):  # records from before compiled decoding have none
        compiled = (f"; compiled {r['compiled_tokens_per_s']:.1f} tok/s, {r['compiled_tokens_per_s'] / roof:.0%} of "
                    f"roofline (HF static cache + compile {r.get('hf_static_compiled_tokens_per_s') or 0:.1f})")
    return (f"{r['ours_tokens_per_s']:.1f} tok/s (plain {r['plain_tokens_per_s']:.1f}, split "
            f"{r['split_tokens_per_s']:.1f}, HF {r['hf_tokens_per_s']:.1f}): **{r['ratio']:.2f}x HF**, "
            f"{r['default_over_best_own']:.2f}x best own{share}{compiled}")


def _train_cell(doc: dict) -> str:
    t = doc.get("train_throughput")
    if not t:
        return "-"
    tps = t["tokens_per_s"]
    ours, theirs = tps.get("tformer fp32"), tps.get("transformers fp32")
    if not ours or not theirs:
        return "-"
    return f"{ours:,.0f} vs HF {theirs:,.0f} tok/s: **{ours / theirs:.2f}x**"


def table() -> str:
    lines = ["| CPU (ISA, BLAS, threads) | measured | gpt2 decode, batch 1 | gpt2 decode, batch 8 | "
             "char-small train step |", "|---|---|---|---|---|"]
    for path in sorted(RESULTS.glob("*.json")):
        doc = json.loads(path.read_text())
        if "gpu_check" in doc:  # a GPU record (bench/gpu_check.sh): `tformer report` lists those
            continue
        m = doc["machine"]
        dates = sorted({doc[s]["date"] + (f" (commit {doc[s]['commit']})" if doc[s].get("commit") else "")
                        for s in ("decode_speed", "train_throughput") if s in doc})
        cpu = f"{m['cpu']}, {m['physical_cores']} cores ({' '.join(m['isa']) or 'baseline'}; {m['blas']}; " \
              f"{m['threads']} threads)"
        lines.append(f"| {cpu} | {', '.join(dates)} | {_decode_cell(_decode(doc, 'gpt2', 1))} "
                     f"| {_decode_cell(_decode(doc, 'gpt2', 8))} | {_train_cell(doc)} |")
    return "\n".join(lines)


if __name__ == "__main__":
    print(table())
    sys.exit(0)
