"""tformer quantize: a checkpoint's Linears to int8 / int4 in a new checkpoint (safetensors, no pickle) that loads
back to the same logits; bad inputs are one line and exit 2."""

from __future__ import annotations

import json

import pytest
import torch

from tests.forked_cli import run_tformer
from tformer.adapt.quantize import quantize_model
from tformer.cli import main
from tformer.core.config import preset
from tformer.data.tokenizers import CharTokenizer
from tformer.interop.checkpoint import load_checkpoint
from tformer.model import build
from tformer.train.checkpoint import save_weights


def _run_dir(tmp_path, **overrides):
    torch.manual_seed(0)
    sizes = dict(n_layers=2, d_model=64, n_heads=4, d_ff=128, vocab_size=8)
    config = preset("char-small").replace(**{**sizes, **overrides})
    model = build(config).eval()
    run = tmp_path / "run"
    save_weights(model, run)
    CharTokenizer("abcdefgh").save(run / "tokenizer")
    return model, run


@pytest.mark.parametrize("to,group,sizes", [("int8", None, {}), ("int4", 64, {}), ("q5_0", None, {}),
                                            ("q4_k", None, {"d_model": 256, "d_ff": 256})])
def test_quantized_checkpoint_loads_to_the_same_logits(tmp_path, to, group, sizes):
    """q5_0 and q4_k keep raw GGUF blocks (a "blocks" tensor where the float Linear had "weight")."""
    model, run = _run_dir(tmp_path, **sizes)
    out = tmp_path / to
    argv = ["quantize", "--ckpt", run, "--to", to, "--out", out, "--json"] + (["--group", group] if group else [])
    done = run_tformer(argv)
    assert done.returncode == 0, done.stderr
    report = json.loads(done.stdout)
    assert report["quantize"] == to and report["bytes_after"] < report["bytes_before"] / 2
    assert b"pickle" not in (out / "model.safetensors").read_bytes()[:8 + 2000]
    loaded, tokenizer = load_checkpoint(out)
    assert tokenizer is not None and loaded.config.quantize == to and loaded.config.quant_group == group
    ids = torch.randint(0, 8, (2, 11), generator=torch.Generator().manual_seed(2))
    with torch.no_grad():
        torch.testing.assert_close(loaded(ids).logits, quantize_model(model, to, group)(ids).logits)


def test_quantize_prints_the_bytes(tmp_path, capsys):
    _, run = _run_dir(tmp_path)
    assert main(["quantize", "--ckpt", str(run), "--to", "int8", "--out", str(tmp_path / "q")]) == 0
    out = capsys.readouterr().out
    assert "model.safetensors" in out and "->" in out and "smaller" in out


def _fails(capsys, argv, *needles):
    assert main([str(a) for a in argv]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1, err
    for needle in needles:
        assert needle in err, err


def test_bad_inputs_are_one_line_exit_2(tmp_path, capsys):
    _, run = _run_dir(tmp_path)
    q = tmp_path / "q8"
    assert main(["quantize", "--ckpt", str(run), "--to", "int8", "--out", str(q)]) == 0
    capsys.readouterr()
    x = tmp_path / "x"
    _fails(capsys, ["quantize", "--ckpt", q, "--to", "int4", "--out", x], "already quantized")
    _fails(capsys, ["quantize", "--ckpt", run, "--to", "int4", "--group", 48, "--out", x], "--group 48", "32, 64")
    _fails(capsys, ["quantize", "--ckpt", run, "--to", "int3", "--out", x], "int3", "int8, int4, q8_0, q4_1")
    _fails(capsys, ["quantize", "--ckpt", run, "--to", "int8", "--group", 32, "--out", x], "drop --group")
    _fails(capsys, ["quantize", "--ckpt", run, "--to", "int8", "--out", run], "itself; inputs are never overwritten")
    assert not x.exists()


def test_a_group_that_does_not_divide_a_layer_names_it(tmp_path, capsys):
    _, run = _run_dir(tmp_path, d_ff=96)
    _fails(capsys, ["quantize", "--ckpt", run, "--to", "int4", "--group", 64, "--out", tmp_path / "x"],
           "layers.0.mlp.down", "input width 96", "(32)")


def test_an_rnn_checkpoint_is_refused(tmp_path, capsys):
    torch.manual_seed(0)
    run = tmp_path / "rnn"
    save_weights(build(preset("char-small").replace(arch="rnn", n_layers=1, d_model=16, vocab_size=8)), run)
    _fails(capsys, ["quantize", "--ckpt", run, "--to", "int8", "--out", tmp_path / "x"], "keep it in float")


def test_training_a_quantized_model_is_refused(tmp_path, capsys):
    argv = ["train", "--preset", "char-small", "--set", "quantize=int8", "--max-steps", 1, "--out", tmp_path / "t"]
    _fails(capsys, argv, "for inference, not training")


def test_bf16_kernel_runs_a_quantized_checkpoint_and_refuses_a_float_one(tmp_path, capsys, monkeypatch):
    """--bf16-kernel puts a quantized model's Linears on torch's int4 kernel (without it, none runs); a model with
    nothing quantized is one line, exit 2."""
    from tformer.model.quantized import kernels

    _, run = _run_dir(tmp_path)
    out = tmp_path / "q"
    assert main(["quantize", "--ckpt", str(run), "--to", "q4_1", "--out", str(out)]) == 0
    calls = []
    kernel = torch._weight_int4pack_mm_for_cpu
    monkeypatch.setattr(torch, "_weight_int4pack_mm_for_cpu", lambda *a: calls.append(1) or kernel(*a))
    argv = ["generate", "--ckpt", str(out), "--prompt", "abcabc", "--greedy", "--max-new-tokens", "6"]
    assert main(argv) == 0 and not calls
    if kernels()[4]:
        assert main([*argv, "--bf16-kernel"]) == 0 and calls
    capsys.readouterr()
    _fails(capsys, ["generate", "--ckpt", run, "--prompt", "abc", "--bf16-kernel"],
           "--bf16-kernel runs quantized matrices, and this model has none")
