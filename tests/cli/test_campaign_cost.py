"""The hostile-input campaign, part 1 (issue 21): count, scale, specs, presets, bench, attention and demo.

Each case builds a hostile input in its own folder (wrong types, out-of-range numbers, unknown names,
missing/empty/binary/huge/deeply nested files, lying hardware descriptions) and runs the real CLI as a
user does, `tformer ...` in a process of its own (forked from a server with torch loaded,
tests/forked_cli.py). Every case must end with exit status 2, its last
stderr line `tformer <command>: error: ...` naming the problem, no traceback anywhere, and every file in
its folder byte-identical afterwards. CAMPAIGN_CASES counts the cases here (89 when written; argparse's
own usage errors are 6 of them); test_campaign_model.py holds the rest (profile, train, generate,
translate, export, report, data) and CAMPAIGN_CASES_TOTAL, both parts together (174 when written).
"""

from __future__ import annotations

import json

import pytest
from campaign_kit import TINY, case, run_case


def tiny(k, **changes) -> str:
    return k.json("tiny.json", {**TINY, **changes})


HARDWARE = {"name": "lab-gpu", "peak_flops": {"fp32": 1e12}, "bandwidth": 1e11}


def on_hardware(k, command: str, *extra: str) -> list[str]:
    """``command`` on the tiny model and the lab device, then ``extra``."""
    return [command, "--config", tiny(k), "--hardware", k.json("hw.json", HARDWARE), *extra]


def training_run(k, *extra: str) -> list[str]:
    """`tformer scale` pricing a 1e9-token run on the lab device, then ``extra``."""
    return on_hardware(k, "scale", "--train-tokens", "1e9", *extra)

COUNT = [
    case("count-unknown-preset", "gpt5")(lambda k: ["count", "--preset", "gpt5"]),
    case("count-batch-not-int", "invalid int")(lambda k: ["count", "--batch", "two"]),
    case("count-batch-zero", "batch")(lambda k: ["count", "--config", tiny(k), "--batch", "0"]),
    case("count-batch-negative", "batch")(lambda k: ["count", "--config", tiny(k), "--batch", "-4"]),
    case("count-seq-zero", "seq")(lambda k: ["count", "--config", tiny(k), "--seq", "0"]),
    case("count-seq-huge", "seq")(lambda k: ["count", "--config", tiny(k), "--seq", str(10 ** 30)]),
    case("count-context-negative", "context")(
        lambda k: ["count", "--config", tiny(k), "--phase", "decode", "--context", "-3"]),
    case("count-seq-decoder-zero", "seq")(
        lambda k: ["count", "--config", tiny(k, arch="encoder-decoder"), "--seq-decoder", "0"]),
    case("count-phase-unknown", "invalid choice")(lambda k: ["count", "--phase", "backward"]),
    case("count-dtype-unknown", "invalid choice")(lambda k: ["count", "--dtype", "fp8"]),
    case("count-efficiency-nan", "efficiency")(
        lambda k: on_hardware(k, "count", "--efficiency", "nan")),
    case("count-efficiency-inf", "efficiency")(
        lambda k: on_hardware(k, "count", "--efficiency", "inf")),
    case("count-efficiency-negative", "efficiency")(
        lambda k: on_hardware(k, "count", "--efficiency", "-0.5")),
    # Layouts beyond one device (issue 22): each impossible one is one line naming the flag.
    case("count-tp-zero", "--tp")(lambda k: ["count", "--config", tiny(k), "--phase", "train", "--tp", "0"]),
    case("count-devices-not-divisible", "divisible")(
        lambda k: ["count", "--config", tiny(k), "--phase", "train", "--devices", "3", "--tp", "2"]),
    case("count-pp-beyond-layers", "--pp")(
        lambda k: ["count", "--config", tiny(k), "--phase", "train", "--devices", "64", "--pp", "64"]),
    case("count-zero-stage-four", "--zero")(lambda k: ["count", "--config", tiny(k), "--phase", "train", "--zero", "4"]),
    case("count-zero-inference", "drop --zero")(
        lambda k: ["count", "--config", tiny(k), "--devices", "2", "--zero", "full_shard"]),
    case("count-micro-batches-no-pipeline", "--pp")(
        lambda k: ["count", "--config", tiny(k), "--phase", "train", "--batch", "4", "--micro-batches", "2"]),
    case("count-link-bandwidth-word", "--link-bandwidth")(
        lambda k: ["count", "--config", tiny(k), "--devices", "2", "--link-bandwidth", "fast"]),
    case("count-link-bandwidth-nan", "--link-bandwidth")(
        lambda k: ["count", "--config", tiny(k), "--devices", "2", "--link-bandwidth", "nan"]),
    case("count-link-latency-negative", "--link-latency")(
        lambda k: ["scale", "--config", tiny(k), "--phase", "train", "--devices", "2", "--link-latency", "-5"]),
    case("count-link-latency-inf", "--link-latency")(
        lambda k: ["count", "--config", tiny(k), "--devices", "2", "--link-latency", "inf"]),
    case("count-efficiency-no-hardware", "--hardware")(
        lambda k: ["count", "--config", tiny(k), "--efficiency", "0.5"]),
    case("count-config-missing", "does not exist")(lambda k: ["count", "--config", str(k.dir / "nope.json")]),
    case("count-config-empty", "not valid JSON")(lambda k: ["count", "--config", k.text("empty.json", "")]),
    case("count-config-binary", "binary")(lambda k: ["count", "--config", k.bytes("bin.json", b"\x00\xff" * 64)]),
    case("count-config-not-utf8", "UTF-8")(lambda k: ["count", "--config", k.bytes("latin.json", b'{"n\xe9": 1}')]),
    case("count-config-huge", "larger than")(lambda k: ["count", "--config", k.huge("huge.json")]),
    case("count-config-nested", "levels deep")(lambda k: ["count", "--config", k.nested("deep.json")]),
    case("count-config-folder", "folder")(lambda k: ["count", "--config", k.folder("cfgdir")]),
    case("count-config-list", "JSON object")(lambda k: ["count", "--config", k.json("list.json", [TINY])]),
    case("count-config-wrong-type", "n_layers")(lambda k: ["count", "--config", tiny(k, n_layers="four")]),
    case("count-config-negative", "n_layers")(lambda k: ["count", "--config", tiny(k, n_layers=-1)]),
    case("count-config-huge-layers", "n_layers")(lambda k: ["count", "--config", tiny(k, n_layers=10 ** 9)]),
    case("count-config-nan-literal", "norm_eps")(
        lambda k: ["count", "--config", k.text("nan.json", json.dumps(TINY)[:-1] + ', "norm_eps": NaN}')]),
    case("count-config-unknown-field", "n_layerz")(lambda k: ["count", "--config", tiny(k, n_layerz=2)]),
    case("count-config-unknown-arch", "arch")(lambda k: ["count", "--config", tiny(k, arch="mamba")]),
    case("count-config-heads-indivisible", "n_heads")(lambda k: ["count", "--config", tiny(k, n_heads=3)]),
    case("count-set-not-a-number", "d_model")(lambda k: ["count", "--config", tiny(k), "--set", "d_model=abc"]),
    case("count-set-no-equals", "KEY=VALUE")(lambda k: ["count", "--config", tiny(k), "--set", "d_model"]),
    case("count-set-unknown-key", "colour")(lambda k: ["count", "--config", tiny(k), "--set", "colour=blue"]),
    case("count-set-nan", "n_layers")(lambda k: ["count", "--config", tiny(k), "--set", "n_layers=nan"]),
    case("count-hardware-unknown", "tpu-v9")(lambda k: ["count", "--config", tiny(k), "--hardware", "tpu-v9"]),
    case("count-hardware-missing-file", "not found")(
        lambda k: ["count", "--config", tiny(k), "--hardware", str(k.dir / "gone.json")]),
    case("count-hardware-nested", "levels deep")(
        lambda k: ["count", "--config", tiny(k), "--hardware", k.nested("hw.json")]),
    case("count-hardware-binary", "binary")(
        lambda k: ["count", "--config", tiny(k), "--hardware", k.bytes("hw.json", bytes(range(256)))]),
    case("count-hardware-negative-peak", "peak")(
        lambda k: ["count", "--config", tiny(k), "--hardware",
                   k.json("hw.json", {**HARDWARE, "peak_flops": {"fp32": -1e12}})]),
    case("count-hardware-nan-bandwidth", "bandwidth")(
        lambda k: ["count", "--config", tiny(k), "--hardware",
                   '{"name": "x", "peak_flops": {"fp32": 1e12}, "bandwidth": NaN}']),
    case("count-hf-no-config", "config.json")(lambda k: ["count", "--hf", k.folder("empty-hf")]),
    case("count-hf-unknown-model-type", "mamba")(
        lambda k: ["count", "--hf", str(k.hf(model_type="mamba"))]),
    case("count-hf-negative-size", "d_model must be positive")(lambda k: ["count", "--hf", str(k.hf(n_embd=-8))]),
]

SCALE = [
    case("scale-factor-zero", "--factor")(lambda k: ["scale", "--config", tiny(k), "--factor", "0"]),
    case("scale-factor-nan", "--factor")(lambda k: ["scale", "--config", tiny(k), "--factor", "nan"]),
    case("scale-factor-inf", "--factor")(lambda k: ["scale", "--config", tiny(k), "--factor", "inf"]),
    case("scale-factor-negative", "--factor")(lambda k: ["scale", "--config", tiny(k), "--factor", "-2"]),
    case("scale-factor-not-number", "invalid float")(lambda k: ["scale", "--factor", "double"]),
    case("scale-knob-unknown", "width")(lambda k: ["scale", "--config", tiny(k), "--knobs", "width"]),
    case("scale-budget-negative", "budget")(lambda k: ["scale", "--config", tiny(k), "--budget", "-1e20"]),
    case("scale-budget-nan", "budget")(lambda k: ["scale", "--config", tiny(k), "--budget", "nan"]),
    case("scale-budget-inf", "budget")(lambda k: ["scale", "--config", tiny(k), "--budget", "inf"]),
    case("scale-train-tokens-no-hardware", "--hardware")(
        lambda k: ["scale", "--config", tiny(k), "--train-tokens", "1e12"]),
    case("scale-train-tokens-negative", "tokens")(
        lambda k: on_hardware(k, "scale", "--train-tokens", "-5")),
    case("scale-devices-zero", "devices")(
        lambda k: training_run(k, "--devices", "0")),
    case("scale-utilization-nan", "utilization")(
        lambda k: training_run(k, "--utilization", "nan")),
    case("scale-utilization-above-one", "utilization")(
        lambda k: training_run(k, "--utilization", "3")),
    case("scale-price-negative", "price")(
        lambda k: training_run(k, "--price", "-2")),
    case("scale-config-truncated", "not valid JSON")(
        lambda k: ["scale", "--config", k.text("cut.json", json.dumps(TINY)[:20])]),
]

OTHERS = [
    case("specs-clock-zero", "--clock-ghz")(lambda k: ["specs", "--clock-ghz", "0"]),
    case("specs-clock-nan", "--clock-ghz")(lambda k: ["specs", "--clock-ghz", "nan"]),
    case("specs-clock-inf", "--clock-ghz")(lambda k: ["specs", "--clock-ghz", "inf"]),
    case("specs-simd-odd", "--simd-bits")(lambda k: ["specs", "--simd-bits", "100"]),
    case("specs-channels-negative", "--memory-channels")(lambda k: ["specs", "--memory-channels", "-1"]),
    case("specs-fma-not-int", "invalid int")(lambda k: ["specs", "--fma-units", "two"]),
    case("presets-stray-argument", "unrecognized arguments")(lambda k: ["presets", "gpt2"]),
    case("bench-sizes-not-int", "--sizes")(lambda k: ["bench", "--sizes", "a,b", "--no-save"]),
    case("bench-sizes-zero", "--sizes")(lambda k: ["bench", "--sizes", "0", "--no-save"]),
    case("bench-reps-zero", "reps")(lambda k: ["bench", "--quick", "--reps", "0", "--no-save"]),
    case("bench-threads-negative", "threads")(lambda k: ["bench", "--quick", "--threads", "-2", "--no-save"]),
    case("bench-device-unknown", "tpu")(lambda k: ["bench", "--quick", "--device", "tpu", "--no-save"]),
    case("bench-dtype-unknown", "fp8")(lambda k: ["bench", "--quick", "--dtypes", "fp8", "--no-save"]),
    case("attention-no-walkthrough", "--walkthrough")(lambda k: ["attention"]),
    case("attention-decimals-huge", "--decimals")(lambda k: ["attention", "--walkthrough", "--decimals", "99"]),
    case("attention-heads-zero", "--heads")(lambda k: ["attention", "--walkthrough", "--heads", "0"]),
    case("attention-heads-three-builtin", "heads")(lambda k: ["attention", "--walkthrough", "--heads", "3"]),
    case("attention-input-missing", "does not exist")(
        lambda k: ["attention", "--walkthrough", "--input", str(k.dir / "none.json")]),
    case("attention-input-nested", "levels deep")(
        lambda k: ["attention", "--walkthrough", "--input", k.nested("deep.json")]),
    case("attention-input-no-x", "X")(
        lambda k: ["attention", "--walkthrough", "--input", k.json("m.json", {"W_Q": [[1]], "W_K": [[1]],
                                                                              "W_V": [[1]]})]),
    case("attention-input-ragged", "X")(
        lambda k: ["attention", "--walkthrough", "--input",
                   k.json("m.json", {"X": [[1, 2], [3]], "W_Q": [[1], [1]], "W_K": [[1], [1]], "W_V": [[1], [1]]})]),
    case("attention-input-string-entry", "X")(
        lambda k: ["attention", "--walkthrough", "--input",
                   k.json("m.json", {"X": [["a"]], "W_Q": [[1]], "W_K": [[1]], "W_V": [[1]]})]),
    case("attention-input-nan", "finite")(
        lambda k: ["attention", "--walkthrough", "--input",
                   k.text("m.json", '{"X": [[NaN]], "W_Q": [[1]], "W_K": [[1]], "W_V": [[1]]}')]),
    case("attention-input-shape-mismatch", "W_Q")(
        lambda k: ["attention", "--walkthrough", "--input",
                   k.json("m.json", {"X": [[1, 2]], "W_Q": [[1]], "W_K": [[1]], "W_V": [[1]]})]),
    case("attention-csv-wrong-width", "4")(
        lambda k: ["attention", "--walkthrough", "--input", k.text("x.csv", "a,1,2\nb,3,4\n")]),
    case("attention-input-binary", "binary")(
        lambda k: ["attention", "--walkthrough", "--input", k.bytes("x.csv", b"\x00\x01\x02")]),
    case("demo-unknown-preset", "gpt5")(lambda k: ["demo", "--preset", "gpt5"]),
    case("demo-batch-zero", "--batch")(lambda k: ["demo", "--batch", "0"]),
    case("demo-seq-negative", "--seq")(lambda k: ["demo", "--seq", "-1"]),
    case("demo-seq-beyond-context", "seq")(lambda k: ["demo", "--seq", "100000"]),
    case("demo-set-negative-size", "d_model")(lambda k: ["demo", "--set", "d_model=-8"]),
]

CASES = COUNT + SCALE + OTHERS
CAMPAIGN_CASES = len(CASES)


@pytest.mark.parametrize("c", CASES)
def test_hostile_input(c, tmp_path, templates):
    run_case(c, tmp_path, templates)
