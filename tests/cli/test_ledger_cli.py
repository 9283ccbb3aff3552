"""`tformer count` and `tformer scale`: JSON for programs, tables for people, one line and exit 2 for bad input."""

from __future__ import annotations

import json

import pytest

from tformer.cli import main


def run_json(capsys, *argv):
    assert main(list(argv) + ["--json"]) == 0
    return json.loads(capsys.readouterr().out)


def test_count_json_keys_and_exact_integers(capsys):
    out = run_json(capsys, "count", "--preset", "gpt2", "--seq", "1024")
    assert out["params"]["total"] == 124_439_808
    assert out["params"]["embedding"] + out["params"]["non_embedding"] == out["params"]["total"]
    assert out["flops"]["matmul"] == 291_648_307_200
    assert out["flops"]["total"] == out["flops"]["matmul"] + out["flops"]["other"]
    for key in ("weights", "gradients", "optimizer", "activations", "kv_cache", "total"):
        assert isinstance(out["memory"][key], int)
    assert sum(op["matmul_flops"] for op in out["ops"]) == out["flops"]["matmul"]
    assert out["conventions"]["flops"].startswith("FLOPs = 2 x multiply-accumulates")
    assert "time_s" not in out


def test_count_json_with_hardware(capsys, tmp_path):
    spec = tmp_path / "dev.json"
    spec.write_text(json.dumps({"name": "my-gpu", "peak_flops": {"fp16": 100e12}, "bandwidth": 1e12}))
    out = run_json(capsys, "count", "--preset", "llama-7b", "--phase", "decode", "--seq", "512", "--dtype", "fp16",
                   "--hardware", str(spec))
    assert isinstance(out["time_s"], float) and out["time_s"] > 0
    assert {op["bound"] for op in out["ops"]} <= {"compute", "memory"}
    assert out["time_s"] == pytest.approx(sum(op["time_s"] for op in out["ops"]))
    # fp32 peak is not in the file: the time is unknown, not borrowed from fp16.
    out = run_json(capsys, "count", "--preset", "char-small", "--hardware", str(spec))
    assert out["time_s"] == "unknown" and {op["bound"] for op in out["ops"]} == {"unknown"}


def test_count_table_for_people(capsys):
    assert main(["count", "--preset", "char-small", "--phase", "train", "--batch", "64", "--seq", "128", "--ops"]) == 0
    text = capsys.readouterr().out
    assert "168,321,613,824 FLOPs" in text and "GiB" in text and "Conventions" in text
    assert "decoder.layers.3.attn.scores" in text and "6ND" in text
    assert max(len(line) for line in text.splitlines()) > 100  # a wide console when piped, tables unwrapped


def test_count_course_convention(capsys):
    args = ["count", "--preset", "char-small", "--set", "tied_embeddings=false", "--seq", "128", "--convention", "course"]
    out = run_json(capsys, *args)
    assert out["flops"]["course_assignment"] == 738_197_504 and out["flops"]["matmul"] == 876_675_072
    assert main(args) == 0
    text = capsys.readouterr().out
    assert "738,197,504" in text and "876,675,072" in text


def test_count_from_config_file_and_hf_dir(capsys, tmp_path):
    cfg = tmp_path / "model.json"
    cfg.write_text(json.dumps({"arch": "decoder", "n_layers": 2, "d_model": 64, "n_heads": 2, "d_ff": 128,
                               "vocab_size": 100, "max_positions": 32}))
    out = run_json(capsys, "count", "--config", str(cfg), "--seq", "32")
    assert out["params"]["total"] > 0
    hf = tmp_path / "hf"
    hf.mkdir()
    (hf / "config.json").write_text(json.dumps({
        "model_type": "gpt2", "n_layer": 12, "n_embd": 768, "n_head": 12, "vocab_size": 50257, "n_positions": 1024,
        "n_inner": None, "activation_function": "gelu_new", "layer_norm_epsilon": 1e-5}))
    out = run_json(capsys, "count", "--hf", str(hf), "--seq", "1024")
    assert out["flops"]["matmul"] == 291_648_307_200 and out["params"]["total"] == 124_439_808


def test_scale_what_if(capsys):
    out = run_json(capsys, "scale", "--preset", "llama-7b", "--seq", "32", "--phase", "prefill", "--dtype", "fp16",
                   "--hardware", "a100-80gb-sxm", "--budget", "1e21", "--train-tokens", "1e9", "--devices", "8")
    rows = {r["knob"]: r for r in out["what_if"]["rows"]}
    assert rows["batch"]["ratios"]["flops"] == 2
    assert out["attention_crossover"]["vs_ffn"] == 3 * 2 * 4096 * 11008 // (4 * 4096)  # SwiGLU FFN vs 4·s·d
    assert out["decode_compute_bound_batch"]["batch"] >= 1
    assert out["training_run"]["seconds"] > 0
    assert set(out["compute_optimal"]) == {"chinchilla_20_tokens_per_param", "chinchilla_fit", "kaplan"}
    assert main(["scale", "--preset", "char-small", "--factor", "4"]) == 0
    assert "x4" in capsys.readouterr().out


@pytest.mark.parametrize("argv,needle", [
    (["count", "--preset", "gpt-5"], "unknown preset"),
    (["count", "--preset", "char-small", "--set", "d_model=7"], "divisible"),
    (["count", "--preset", "char-small", "--batch", "0"], "batch"),
    (["count", "--preset", "gpt2", "--seq", "4096"], "max_positions"),
    (["count", "--preset", "bert-base", "--phase", "decode"], "encoder"),
    (["count", "--preset", "gpt2", "--hardware", "warp-drive-9000"], "warp-drive-9000"),
    (["count", "--preset", "gpt2", "--phase", "train", "--dtype", "int8"], "int8"),
    (["scale", "--preset", "gpt2", "--factor", "1.3"], "whole"),
])
def test_bad_input_is_one_line_and_exit_2(capsys, argv, needle):
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert len(err.strip().splitlines()) == 1 and needle in err and "Traceback" not in err


def test_malformed_config_file(capsys, tmp_path):
    bad = tmp_path / "bad.json"
    bad.write_text("{not json")
    assert main(["count", "--config", str(bad)]) == 2
    err = capsys.readouterr().err
    assert len(err.strip().splitlines()) == 1 and "not valid JSON" in err
