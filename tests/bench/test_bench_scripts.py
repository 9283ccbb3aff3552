"""The bench/ scripts run end to end on tiny settings and print the figures their docstrings promise.

Their speed targets are not asserted here (timings belong to the scripts); what is checked is that
every line a user reads, ratio and ceiling included, is still produced from live measurements."""

from __future__ import annotations

import importlib.util
import json
import re
from pathlib import Path

import pytest
import torch

from tformer.core.errors import TformerError

BENCH = Path(__file__).resolve().parents[2] / "bench"


def load(name: str):
    spec = importlib.util.spec_from_file_location(f"bench_{name}", BENCH / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_budget_lines_split_the_target_time_into_weights_and_glue():
    decode = load("decode_speed")
    # transformers at 20 tokens/s -> 25 ms per token at 2x; 400 MB at 20 GB/s -> 20 ms; glue 3 ms.
    lines = decode.budget_lines(20.0, 30.0, 400e6, 20e9, 0.003)
    text = "\n".join(lines)
    assert "<= 25.0 ms per token" in text and "takes 20.0 ms, leaving 5.0 ms" in text
    assert "glue" in text and "3.0 ms" in text
    assert "2.17x (reachable" in text  # 50 ms / (20 + 3) ms
    slow = "\n".join(decode.budget_lines(20.0, 30.0, 600e6, 20e9, 0.003))
    assert "1.52x (below" in slow  # 50 ms / (30 + 3) ms


def test_decode_speed_runs_and_reports_ratio_and_budget(capsys, tmp_path):
    pytest.importorskip("transformers")
    decode = load("decode_speed")
    out_json = tmp_path / "decode.json"
    assert decode.main(["--models", "char-small", "--batches", "1", "--prompt", "4", "--new", "6",
                        "--contexts", "16", "--repeats", "2", "--no-uncached-hf", "--json", str(out_json),
                        "--no-save", "--compile", "eager"]) == 0
    out = capsys.readouterr().out
    assert re.search(r"^machine: .+ cores / .+ CPUs, ISA .+, BLAS \S+", out, re.M)
    # default, plain, split, compiled, HF, HF static, HF static+compiled, roofline tokens/s, then default/HF,
    # default over tformer's best own path, and compiled over the roofline
    assert re.search(r"^\s+1\s+yes(\s+[\d.]+){8}\s+[\d.]+x\s+[\d.]+x\s+\d+%$", out, re.M)
    assert "best ratio with the products at the stream rate" in out
    record = json.loads(out_json.read_text())["decode"][0]
    assert record["glue_s"] > 0 and record["weights_at_read_bw_s"] > 0 and record["ratio"] > 0
    assert record["plain_tokens_per_s"] > 0 and record["split_tokens_per_s"] > 0
    assert record["compiled_tokens_per_s"] > 0 and record["hf_static_tokens_per_s"] > 0
    assert record["compiled_over_read_roofline"] == pytest.approx(
        record["compiled_tokens_per_s"] / record["read_roofline_tokens_per_s"])
    assert record["default_over_best_own"] == pytest.approx(
        record["ours_tokens_per_s"] / max(record[f"{p}_tokens_per_s"] for p in ("ours", "plain", "split")))


def test_train_throughput_runs_and_reports_ratio_and_ceiling(capsys):
    pytest.importorskip("transformers")
    train = load("train_throughput")
    train.main(["--batch", "2", "--seq", "16", "--steps", "1", "--rounds", "1", "--no-save"])
    out = capsys.readouterr().out
    assert re.search(r"^machine: .+ BLAS \S+", out, re.M)
    assert re.search(r"ratio tformer / transformers tokens/s, both fp32: [\d.]+x", out)
    rows = re.findall(r"^\s+(tformer|transformers)\s+(\d+) ms\s+(\d+) ms\s+(-?\d+) ms\s+(\d+) ms\s+([\d.]+)x$", out, re.M)
    assert [r[0] for r in rows] == ["tformer", "transformers"]
    for _, gemm, attention, rest, step, _ratio in rows:  # the three parts add up to the step (rounded to ms)
        assert abs(int(gemm) + int(attention) + int(rest) - int(step)) <= 2
    assert re.search(r"ceiling over transformers with every other op free: [\d.]+x", out)


TINY_TRAIN = ["--set", "n_layers=1", "--set", "d_model=32", "--set", "n_heads=2", "--set", "d_ff=64", "--batch", "2",
              "--seq", "16", "--steps", "1", "--rounds", "1", "--matmul-n", "64", "--no-save"]


def _train_record(train, args, out_json):
    assert train.main([*TINY_TRAIN, *args, "--json", str(out_json)]) == 0
    return json.loads(out_json.read_text())


def test_train_throughput_prints_mfu_against_a_peak_measured_in_the_run(capsys, tmp_path):
    pytest.importorskip("transformers")
    train = load("train_throughput")
    record = _train_record(train, ["--bf16"], tmp_path / "train.json")
    out = capsys.readouterr().out
    assert re.search(r"^model\s+precision\s+ms/step\s+tokens/s\s+spread ms\s+MFU measured$", out, re.M)
    for who in ("tformer", "transformers"):
        for p in ("fp32", "bf16 autocast"):
            assert re.search(rf"^{who}\s+{p}\s+[\d.]+\s+[\d,]+\s+[\d.]+-[\d.]+\s+[\d.]+%$", out, re.M), (who, p)
    assert re.search(r"^  bf16 autocast matmul peak measured in this run \(n = 64\): [\d.]+ [kMGT]?FLOP/s$", out, re.M)
    assert record["seq"] == 16 and record["batch"] == 2 and record["device"] == "cpu"
    assert set(record["tokens_per_s"]) == {f"{w} {p}" for w in ("tformer", "transformers")
                                            for p in ("fp32", "bf16 autocast")}
    assert all(v > 0 for v in record["mfu_measured"].values()) and record["matmul_peak_measured"]["fp32"] > 0
    # MFU is the ledger's matmul FLOPs over the step time, against the peak measured in the run
    t = record["step_s"]["tformer fp32"]
    assert record["mfu_measured"]["tformer fp32"] == pytest.approx(
        record["matmul_flops"] / t / record["matmul_peak_measured"]["fp32"])
    assert record["mfu_spec"] == {}  # a CPU has no spec-sheet row to set it against
    assert record["summary"].startswith("char-small T=16, tformer ") and "of the measured matmul peak" in record["summary"]


def test_train_throughput_on_cuda_or_a_clear_error(capsys, tmp_path):
    pytest.importorskip("transformers")
    train = load("train_throughput")
    if not torch.cuda.is_available():
        with pytest.raises(TformerError, match="CUDA"):
            train.main([*TINY_TRAIN, "--device", "cuda"])
        return
    record = _train_record(train, ["--device", "cuda", "--bf16"], tmp_path / "gpu.json")
    assert record["device"].startswith("cuda") and record["device_name"]
    assert "MFU spec" in capsys.readouterr().out


@pytest.mark.slow
def test_train_throughput_times_eager_and_compiled_in_one_run(capsys, tmp_path):
    pytest.importorskip("transformers")
    train = load("train_throughput")
    record = _train_record(train, ["--compile"], tmp_path / "train.json")
    out = capsys.readouterr().out
    for who in ("tformer", "transformers"):
        assert re.search(rf"^{who} compiled\s+fp32\s+[\d.]+\s+[\d,]+\s+", out, re.M)
        assert re.search(rf"ratio {who} compiled / eager tokens/s, fp32: [\d.]+x", out)
        assert record["compile_s"][who] > 0 and record["tokens_per_s"][f"{who} compiled fp32"] > 0
    assert re.search(r"ratio tformer compiled / transformers compiled tokens/s, fp32: [\d.]+x", out)


def test_cli_latency_times_count_beside_its_peers(capsys):
    latency = load("cli_latency")
    assert latency.main(["--runs", "1", "--preset", "char-small", "--phase", "forward"]) == 0
    out = capsys.readouterr().out
    for label in ("tformer count --preset char-small --phase forward --json", 'python -c "import torch"',
                  "python -c pass"):
        assert re.search(rf"^\s+[\d.]+ s\s+\(min [\d.]+, max [\d.]+\)\s+{re.escape(label)}$", out, re.M), label
    assert re.search(r"^count: [\d.]+ s, (meets|MISSES) the 0.5 s target; [\d.]+ s above bare interpreter start; "
                     r"importing torch alone takes [\d.]+ s$", out, re.M)
    assert re.search(r"^ledger\(char-small, train, seq 128, bf16 mixed\) in this process: [\d.]+ ms median "
                     r"\(min [\d.]+, max [\d.]+\), (meets|MISSES) the 0.5 s target$", out, re.M)


def test_attention_scaling_prints_each_table_and_the_target_line(capsys, tmp_path):
    scaling = load("attention_scaling")
    out_json = tmp_path / "scaling.json"
    assert scaling.main(["--max-n", "256", "--quick", "--no-save", "--json", str(out_json)]) == 0
    out = capsys.readouterr().out
    assert re.search(r"^machine: .+ BLAS \S+", out, re.M)
    for mode in ("forward", "forward+backward"):
        assert re.search(rf"^{re.escape(mode)}\nkind\s+n\s+measured\s+predicted", out, re.M)
        assert re.search(r"^(sdpa|reference)\s+256\s+\S+", out, re.M)
    assert re.search(r"^reference\s+exact\s+-\s+(n >= 256|never up to 256)", out, re.M)  # crossover vs sdpa
    from tformer.core.attention_kinds import ATTN_KINDS, EXACT_KINDS

    guide = re.search(r"^< 512\s+plain attention\s+(\S+)\s+(\S+)$", out, re.M)
    assert guide and guide[1] in EXACT_KINDS and guide[2] in ATTN_KINDS  # fastest exact, fastest of all
    assert len(re.findall(r"^(\w+)\s+256\s+\S+", out, re.M)) >= len(ATTN_KINDS)  # every kind ran
    assert "target: tiled at n = 8192 peak" in out
    record = json.loads(out_json.read_text())
    assert [k["kind"] for k in record["kinds"]][:2] == ["sdpa", "reference"]
    assert all(p["measured_peak"] > 0 for k in record["kinds"] for p in k["points"])


def test_attention_quality_trains_each_kind_beside_exact_attention(capsys, tmp_path):
    quality = load("attention_quality")
    out_json = tmp_path / "quality.json"
    assert quality.main(["--steps", "2", "--kinds", "reference", "--batch", "2", "--seq", "32", "--eval-batches", "1",
                         "--no-save", "--json", str(out_json)]) == 0
    out = capsys.readouterr().out
    assert re.search(r"^kind\s+family\s+settings\s+validation loss\s+vs sdpa$", out, re.M)
    assert re.search(r"^sdpa\s+exact\s+-\s+[\d.]+\s+-$", out, re.M)
    assert re.search(r"^reference\s+exact\s+-\s+[\d.]+\s+[+-][\d.]+$", out, re.M)
    record = json.loads(out_json.read_text())
    assert record["steps"] == 2 and [k["kind"] for k in record["kinds"]] == ["sdpa", "reference"]
    # same seed, same data, same weights: the two exact kinds agree
    assert record["kinds"][0]["val_loss"] == pytest.approx(record["kinds"][1]["val_loss"], abs=1e-3)


@pytest.mark.slow
def test_serve_load_quick_drives_both_servers_and_prints_the_table(capsys, tmp_path):
    pytest.importorskip("httpx")
    serve_load = load("serve_load")
    out_json = tmp_path / "serve_load.json"
    assert serve_load.main(["--quick", "--levels", "1,2", "--requests", "3", "--max-tokens", "4",
                            "--time-limit", "120", "--json", str(out_json)]) == 0
    out = capsys.readouterr().out
    assert re.search(r"^machine: .+ BLAS \S+", out, re.M)
    for mode in ("continuous", "one-at-a-time"):
        for clients in (1, 2):  # every request answered, 4 tokens each, nothing failed
            assert re.search(rf"^{mode}\s+{clients}\s+3\s+0\s+[\d.]+\s+[\d.]+(\s+[\d.]+){{6}}\s*$", out, re.M), mode
    # The prediction needs the machine's roofs: a saved profile, or a CPU whose bandwidth is known; else "-"
    device = serve_load.prediction_device()
    known = device.bandwidth is not None and device.peak("fp32") is not None
    guess = r"[\d.]+x" if known else "-"
    assert re.search(rf"^2\s+[\d.]+\s+[\d.]+\s+[\d.]+x\s+2\s+{guess}\s+{guess}$", out, re.M)
    assert "failed requests: 0 (meets the zero-failure target)" in out
    record = json.loads(out_json.read_text())
    for mode in ("continuous", "one-at-a-time"):
        for level in record["results"][mode].values():
            assert level["tokens"] == 3 * 4 and level["failed"] == 0 and level["unfinished"] == 0
    assert record["predicted_speedup"]["1"]["profile"] == (1.0 if known else None)
