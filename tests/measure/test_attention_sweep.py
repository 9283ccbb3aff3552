"""The attention sweep (tformer.measure.attention_sweep) and its memory tracker (measure.memory_peak):
the tracker against allocations of known size, the ledger's prediction of the step-by-step path's
peak against the tracker, the budgets that stop a kind, and the readings (crossover, guide)."""

import pytest
import torch

from tformer.core.attention_kinds import ATTN_KINDS
from tformer.core.errors import TformerError
from tformer.cost import attention as cost_attention
from tformer.measure import attention_sweep as S
from tformer.measure.memory_peak import PeakTensorMemory, peak_bytes
from tformer.model.attention import registry
from tformer.model.attention.sdpa import sdpa


def test_tracker_counts_live_bytes_and_frees():
    with PeakTensorMemory() as m:
        a = torch.empty(1000, 1000)  # 4 MB
        b = torch.empty(500, 1000)  # 2 MB, both alive: the peak
        del a
        c = torch.empty(250, 1000)  # 1 MB
    assert m.peak == 6_000_000 and m.live == 3_000_000
    del b, c
    assert m.live == 0


def test_tracker_skips_views_in_place_results_and_what_existed_before():
    before = torch.ones(1000)
    with PeakTensorMemory() as m:
        before.t().view(10, 100).add_(1)  # views and an in-place op on an older tensor: nothing new
        x = torch.zeros(2000)  # 8000 B
        x.view(20, 100).mul_(2)
    assert m.peak == 8000
    del x


def test_tracker_sees_the_backward_pass():
    q = torch.randn(1, 2, 128, 16, requires_grad=True)

    def step():
        w = (q @ q.transpose(-1, -2)).softmax(-1)  # (1, 2, 128, 128) kept for the backward
        (w @ q).sum().backward()

    scores = 2 * 128 * 128 * 4
    assert peak_bytes(step) >= 3 * scores  # the weights, their gradient and the scores' gradient


@pytest.mark.parametrize("mode", S.MODES)
def test_predicted_peak_of_the_step_by_step_path_matches_the_tracker(mode):
    spec = S.SweepSpec(ns=(256,), heads=2, head_dim=16)
    predicted = S.predict("reference", 256, mode, spec)["peak"]
    assert predicted == pytest.approx(S.measure("reference", 256, mode, spec)[1], rel=0.15)
    out = 2 * 256 * 16 * 4
    scores = 2 * 256 * 256 * 4
    assert predicted == (out + 2 * scores if mode == "forward" else 4 * out + 3 * scores)


def test_prediction_reads_the_ledger_rows_and_backward_is_twice_the_matmuls():
    spec = S.SweepSpec(heads=4, head_dim=64)
    fwd, both = (S.predict("sdpa", 1024, m, spec) for m in S.MODES)
    rows = cost_attention.attention_rows("sdpa", S.attention_call("sdpa", 1024, spec))
    assert fwd["flops"] == sum(op.flops for op in rows)
    assert both["flops"] > 2 * fwd["flops"] and fwd["time_s"] is None  # no device: no time


def test_budgets_stop_a_kind_and_say_why():
    tiny = S.SweepSpec(ns=(32, 64, 128), modes=("forward",), reps=1, min_rep_s=0.0, time_budget_s=0.0)
    r = S.sweep_kind("sdpa", tiny)
    assert [p.n for p in r.points] == [32] and r.stopped["forward"].startswith("stopped after n=32")
    small = S.SweepSpec(ns=(32, 64), modes=("forward",), reps=1, min_rep_s=0.0, memory_budget=1)
    r = S.sweep_kind("reference", small)
    assert not r.points and "predicted peak" in r.stopped["forward"]
    spent = S.SweepSpec(ns=(32, 64), modes=("forward",), reps=1, min_rep_s=0.0, total_budget_s=1e-9)
    results, _ = S.sweep(spent, kinds=["sdpa"])
    assert "budget is spent" in results[0].stopped["forward"]


def test_every_registered_kind_runs_and_missing_ones_are_noted(monkeypatch):
    # A kind another branch adds (here "tiled", computed by sdpa for the test) is picked up with its settings.
    monkeypatch.setitem(registry.ATTENTION, "tiled", sdpa)
    monkeypatch.setitem(cost_attention.ATTENTION_COSTS, "tiled", cost_attention.sdpa)
    kinds, notes = S.available_kinds()
    assert kinds[:3] == ["sdpa", "reference", "tiled"]
    assert len(kinds) + len(notes) == len(ATTN_KINDS)
    spec = S.SweepSpec(ns=(32,), modes=S.MODES, reps=1, min_rep_s=0.0)
    results, _ = S.sweep(spec, kinds=["sdpa", "tiled"])
    assert results[1].settings == {"attn_block": 64} and len(results[1].points) == 2
    assert S.kind_options("tiled", 32).block == S.SETTINGS["attn_block"]
    with pytest.raises(TformerError, match="unknown attention kind"):
        S.available_kinds(["nope"])


def _kind(name, family, times):
    r = S.KindSweep(name, family, True, {})
    r.points = [S.Point(name, n, "forward", t, None, 0, 0, 100 * n, 100 * n) for n, t in times.items()]
    return r


def test_crossover_guide_and_target_read_the_points():
    results = [_kind("sdpa", "exact", {256: 1.0, 1024: 2.0, 4096: 8.0, 8192: 30.0}),
               _kind("reference", "exact", {256: 0.5, 1024: 3.0, 4096: 20.0}),
               _kind("fastlong", "approximate", {256: 2.0, 1024: 1.5, 4096: 4.0, 8192: 6.0})]
    assert S.crossover(results, "fastlong", "forward") == (1024, "n >= 1024")
    assert S.crossover(results, "reference", "forward")[1] == "never up to 4096"
    guide = {g["band"]: g for g in S.selection_guide(results)}
    assert guide["< 512"]["fastest"] == "reference" and guide["2048-8192"]["fastest_exact"] == "sdpa"
    assert guide[">= 8192"]["fastest"] == "fastlong" and guide["512-2048"]["ns"] == [1024]
    assert "not measured" in S.memory_target(results, S.SweepSpec(), n=8192, kind="tiled")
    assert "(measured): 1.000 of it, MISSED" in S.memory_target(results, S.SweepSpec(), n=4096, kind="fastlong")
    # reference stopped before 8192: its predicted peak stands in, and says so
    assert "(predicted (not measured: budget)): 0.000 of it, met" in S.memory_target(results, S.SweepSpec(),
                                                                                        kind="fastlong")
