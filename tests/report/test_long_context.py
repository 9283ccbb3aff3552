"""Section 9, "Attention at long context": built from a tiny sweep with only the kinds this build
registers, its two log-log figures, the guide beside the textbook's, the quality table read from a
bench record (or the line naming the command), and --no-long-context."""

import argparse
import json
from types import SimpleNamespace

import pytest

from tformer.cli import report as cli_report
from tformer.machine import resolve_hardware
from tformer.machine.profile_store import bench_results_name
from tformer.measure.attention_sweep import SweepSpec
from tformer.model import ATTENTION
from tformer.report import section_long_context as L
from tformer.report.doc import Figure, Table

CPU = SimpleNamespace(model="Fake Long CPU", physical_cores=2, logical_cpus=4)
TINY = SweepSpec(ns=(32, 64), modes=("forward",), reps=1, min_rep_s=0.0, total_budget_s=30.0)


def context(measured=None, long_context=True):
    return SimpleNamespace(options=SimpleNamespace(long_context=long_context, quick=True), torch_device="cpu",
                           measured=measured, specs=SimpleNamespace(cpu=CPU), results={}, data={},
                           say=lambda _m: None)


@pytest.mark.parametrize("device", [None, "h100-sxm"])
def test_section_from_a_tiny_sweep(device, tmp_path, monkeypatch):
    monkeypatch.setattr(L, "RESULTS_DIR", tmp_path)  # no record: the section names the command
    ctx = context(resolve_hardware(device) if device else None)
    ctx.results["long_context"] = L.measure(ctx, TINY)
    sec = L.build(ctx)
    assert sec.heading == "9. Attention at long context"
    figures = [b for b in sec.blocks if isinstance(b, Figure)]
    assert [f.name for f in figures] == ["long_context_time", "long_context_memory"]
    assert all(f.png[:8] == b"\x89PNG\r\n\x1a\n" for f in figures)
    tables = {b.caption.split(":")[0]: b for b in sec.blocks if isinstance(b, Table)}
    guide = tables["The measured selection guide for this machine beside the textbook's (chapters 16 and 19)"]
    assert [r[1] for r in guide.rows] == ["plain attention", "Flash, else a window of 256",
                                          "Longformer / BigBird, or Flash", "Performer"]
    assert guide.rows[0][2] in ("sdpa", "reference") and guide.rows[-1][3] == "not measured"
    points = tables["Each call, measured beside the ledger"].rows
    assert {(r[0], r[1]) for r in points} == {(k, str(n)) for k in ATTENTION for n in (32, 64)}
    assert all((r[3] == "unknown") == (device is None) for r in points)
    assert "python bench/attention_quality.py" in sec.blocks[-1].text
    data = ctx.data["long_context"]
    assert data["quality"]["missing"] and {k["kind"] for k in data["kinds"]} == set(ATTENTION)


def test_quality_table_comes_from_the_bench_record(tmp_path, monkeypatch):
    record = {"date": "2026-01-02", "exact": "sdpa", "steps": 7, "seed": 3, "skipped": ["linformer: cannot be causal"],
              "kinds": [{"kind": "sdpa", "family": "exact", "settings": {}, "val_loss": 2.5},
                        {"kind": "sliding", "family": "sparse", "settings": {"attn_window": 32}, "val_loss": 2.625}]}
    (tmp_path / bench_results_name(CPU.model, 2)).write_text(json.dumps({"attention_quality": record}))
    monkeypatch.setattr(L, "RESULTS_DIR", tmp_path)
    ctx = context(long_context=False)
    ctx.results["long_context"] = L.measure(ctx)
    sec = L.build(ctx)
    assert "--no-long-context" in sec.blocks[0].text
    table = next(b for b in sec.blocks if isinstance(b, Table))
    assert table.rows == [["sdpa", "exact", "-", "2.500", "-"], ["sliding", "sparse", "window 32", "2.625", "+0.125"]]
    assert "7 steps" in table.caption and "2026-01-02" in table.caption
    assert sec.blocks[-1].items == ["linformer: cannot be causal"]


def test_no_long_context_flag_reaches_the_options():
    p = argparse.ArgumentParser()
    cli_report.add_arguments(p)
    assert p.parse_args([]).long_context is True
    assert p.parse_args(["--no-long-context"]).long_context is False
    assert L.measure(context(long_context=False)) == {"skip": "skipped (--no-long-context)"}
