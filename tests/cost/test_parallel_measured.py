"""The ledger's per-device bytes (tformer.cost.parallel) against a real 2-process torchrun over gloo:
DDP, FSDP2 full_shard and FSDP2 shard_grad_op on a tiny decoder whose every size is odd, so FSDP's
ceil-sharding of dim 0 shows. The runs are tformer.train.parallel_check's (bench/distributed.py and the
report's "Beyond one device" use the same); bytes only, no timing asserted."""

from __future__ import annotations

import importlib.util
import math
from pathlib import Path

import pytest

from tformer.core.config import preset
from tformer.core.errors import TformerError
from tformer.cost.ledger import Workload
from tformer.cost.parallel import Layout, per_device
from tformer.cost.placement import stage_parameters
from tformer.model import build
from tformer.model.runners import runner_for
from tformer.train.parallel_check import can_run, compare, first_rank_error, run_probe, timing

BENCH = Path(__file__).resolve().parents[2] / "bench"
TINY = ["d_model=27", "n_heads=3", "d_ff=45", "n_layers=1", "vocab_size=67", "max_positions=9"]
BATCH, SEQ, WORLD = 2, 8, 2


def _bench():
    spec = importlib.util.spec_from_file_location("bench_distributed", BENCH / "distributed.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.fixture(scope="module")
def measured():
    ok, why = can_run(WORLD)
    if not ok:
        pytest.skip(why)
    config = preset("char-small").with_overrides(TINY)
    result = run_probe(config, WORLD, BATCH, SEQ, warmup=0, steps=1)
    return config, result, compare(config, result), _bench()


def _row(rows, layout, kind):
    return next(r for r in rows if r["layout"] == layout and r["kind"] == kind)


@pytest.mark.parametrize("layout", ["ddp", "full_shard", "shard_grad_op"])
@pytest.mark.parametrize("kind", ["weights", "gradients", "optimizer"])
def test_rank_zero_holds_what_the_ledger_predicts(measured, layout, kind):
    _, result, rows, _ = measured
    assert result["world"] == WORLD
    r = _row(rows, layout, kind)
    assert r["measured"] > 0
    assert r["measured"] == pytest.approx(r["predicted"], rel=0.01), r


def test_shard_grad_op_holds_whole_weights_between_forward_and_backward(measured):
    _, result, _, _ = measured
    zero2 = next(m for m in result["layouts"] if m["layout"] == "shard_grad_op")
    zero3 = next(m for m in result["layouts"] if m["layout"] == "full_shard")
    assert zero2["weights_after_forward"] > zero2["weights_at_rest"] == zero3["weights_at_rest"]
    assert zero3["weights_after_forward"] == zero3["weights_at_rest"]  # full_shard frees the gathered copies


def test_ddp_hook_payload_is_the_ledgers_all_reduce(measured):
    _, result, rows, _ = measured
    ddp = next(m for m in result["layouts"] if m["layout"] == "ddp")
    assert ddp["collectives"]["all_reduce"] == ddp["gradients"]  # every gradient byte, once per step
    r = _row(rows, "ddp", "data_parallel_all_reduce")
    assert r["measured"] == pytest.approx(r["predicted"], rel=0.01), r


@pytest.mark.parametrize("layout", ["ddp", "full_shard", "shard_grad_op"])
def test_collective_calls_are_the_ledgers(measured, layout):
    """The alpha-beta time counts one latency per call: DDP one bucket here, FSDP2 one reduce-scatter and one
    (shard_grad_op) or two (full_shard) all-gathers per unit, a unit per layer plus the root."""
    _, _, rows, _ = measured
    traffic = [r for r in rows if r["layout"] == layout and "calls" in r]
    assert traffic
    for r in traffic:
        assert r["calls"] == r["predicted_calls"] > 0, r


def test_fsdp_moves_padded_shards(measured):
    """FSDP2's collectives carry every rank's ceil(rows / N)-row shard: N x the rank-0 shard, not the
    unpadded parameters; full_shard gathers twice per step (forward, backward), shard_grad_op once."""
    config, result, _, _ = measured
    shapes = [s for _, s in stage_parameters(config)[0]]
    padded = WORLD * sum(math.ceil(s[0] / WORLD) * math.prod(s[1:]) for s in shapes) * 4
    assert padded > sum(math.prod(s) for s in shapes) * 4  # the odd sizes do pad
    gathers = {"full_shard": 2, "shard_grad_op": 1}
    for m in result["layouts"]:
        if m["layout"] in gathers:
            assert m["collectives"] == {"all_gather": gathers[m["layout"]] * padded, "reduce_scatter": padded}


def test_bench_prints_every_layout_and_the_step_time_block(measured, capsys):
    config, result, rows, bench = measured
    single_s = result["single"]["step_s"]
    times = timing(config, result)
    assert [t["layout"] for t in times] == ["ddp", "full_shard", "shard_grad_op"]
    assert all(t["serial_s"] >= t["overlapped_s"] >= single_s > 0 and t["efficiency"] > 0 for t in times)
    bench.print_tables(rows, times, single_s, result)
    out = capsys.readouterr().out
    assert "bus bandwidth" in out and "rank 0 of 2" in out
    assert len([line for line in out.splitlines() if line.split()[:1] == ["ddp"]]) == 5  # 4 byte rows, 1 time row


def test_shard_grad_op_keeps_its_shard_as_the_ledger_counts(measured):
    """At rest a shard_grad_op rank holds only its shard; the ledger counts that shard beside the gathered
    weights (kept_shard: fp32 has no master copy for it to be)."""
    config, result, _, _ = measured
    zero2 = next(m for m in result["layouts"] if m["layout"] == "shard_grad_op")
    ledger = per_device(config, Workload(phase="train", batch=BATCH, seq=SEQ), Layout(devices=WORLD, zero=2))
    assert zero2["weights_at_rest"] == ledger["kept_shard"] > 0


@pytest.mark.slow
def test_bert_with_a_pooler_trains_under_ddp_and_fsdp_as_the_ledger_says():
    """BERT's pooler output is returned but no masked-token loss reads it: DDP would wait for its gradients
    and fail the next step. Training freezes it (runner.loss_skips), and the ledger gives it no gradient or
    optimizer state, so both layouts still hold and send exactly the ledger's bytes."""
    ok, why = can_run(WORLD)
    if not ok:
        pytest.skip(why)
    config = preset("bert-base").with_overrides(["n_layers=1", "d_model=27", "n_heads=3", "d_ff=45",
                                                  "vocab_size=67", "max_positions=9", "lm_head=true"])
    assert config.pooler and runner_for(build(config)).loss_skips == ("pooler.",)
    result = run_probe(config, WORLD, BATCH, SEQ, warmup=0, steps=1, layouts="ddp,full_shard")
    rows = compare(config, result)
    assert {r["kind"] for r in rows} >= {"gradients", "data_parallel_all_reduce", "zero_reduce_scatter"}
    for r in rows:
        assert r["measured"] == pytest.approx(r["predicted"], rel=0.01), r
        assert r.get("calls") == r.get("predicted_calls"), r


def test_a_rank_error_is_its_own_line_not_torchruns_banner():
    text = ("[rank0]: Traceback (most recent call last):\n"
            "[rank0]: RuntimeError: Expected to have finished reduction in the prior iteration\n"
            "torch.distributed.elastic.multiprocessing.errors.ChildFailedError:\n"
            "============================================================\n")
    assert first_rank_error(text) == "RuntimeError: Expected to have finished reduction in the prior iteration"
    assert first_rank_error("tformer.core.errors.TformerError: no LM head\n====\n") == "TformerError: no LM head"
    assert first_rank_error("") == "no output"


def test_a_run_past_its_time_is_stopped_with_all_its_ranks():
    """A million steps cannot finish in 4 s; by then the ranks are running (a whole tiny run takes about
    5 s here, most of it starting them), and stopping the run must stop them too."""
    ok, why = can_run(WORLD)
    if not ok or not Path("/proc").is_dir():
        pytest.skip(why or "no /proc to list the processes left")
    config = preset("char-small").with_overrides(TINY)
    with pytest.raises(TformerError, match="did not finish in 4 s"):
        run_probe(config, WORLD, BATCH, SEQ, warmup=0, steps=10**6, timeout_s=4)
    assert not [cmd for cmd in _command_lines() if "tformer.train.parallel_probe" in cmd]


def _command_lines() -> list[str]:
    out = []
    for proc in Path("/proc").glob("[0-9]*"):
        try:
            out.append((proc / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace"))
        except OSError:  # gone meanwhile
            continue
    return out
