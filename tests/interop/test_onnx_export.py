"""ONNX export: ONNX Runtime's outputs equal PyTorch's within 1e-4 for every exportable kind of model, at a
batch and a length the graph was not traced at, with padding in the mask; `tformer export --format onnx`
writes the files and checks them; bad input is one line, exit 2."""

from __future__ import annotations

import json

import pytest
import torch

from tformer.cli import main
from tformer.core.config import preset
from tformer.core.errors import TformerError
from tformer.interop.checkpoint import save_model
from tformer.interop.onnx_export import (
    CHECK_SHAPE,
    EXPORT_SHAPE,
    META_FILE,
    MODEL_FILE,
    export_onnx,
    run_onnx,
    sample_inputs,
    signature,
)
from tformer.model import build
from tformer.model.masks import tracing

pytest.importorskip("onnxruntime")
pytest.importorskip("onnxscript")

TOL = 1e-4
TINY = ["n_layers=2", "d_model=36", "n_heads=4", "d_ff=44", "vocab_size=97"]
CONFIGS = {
    "gpt2": ("gpt2", []),
    "llama": ("llama-7b", ["n_kv_heads=2", "head_dim=10"]),  # RoPE, grouped-query attention, RMSNorm, SwiGLU
    "roberta-mlm": ("roberta-base", ["max_positions=40"]),  # MLM logits; positions counted over non-pad tokens
    "bert-classifier": ("bert-base", ["task=sequence-classification", "n_classes=3"]),  # segments, pooler
    "gpt2-answers": ("gpt2", ["task=question-answering"]),
    "t5": ("t5-small", ["n_decoder_layers=3", "head_dim=10"]),  # relative position bias
    "bart": ("bart-base", ["n_decoder_layers=1"]),  # decoder self-attention without a mask: plain causal SDPA
    "vit": ("vit-digits", ["n_layers=2", "d_model=36", "n_heads=3", "d_ff=44", "n_classes=7"]),
}
# batch and length other than EXPORT_SHAPE and CHECK_SHAPE, so equality proves both axes are dynamic
OTHER_SHAPE = (4, 13)


def _model(name, extra=()):
    base, overrides = CONFIGS[name]
    tiny = TINY if base != "vit-digits" else []
    torch.manual_seed(0)
    return build(preset(base).with_overrides([*tiny, *overrides, *extra])).eval()


@pytest.mark.slow  # torch.onnx's dynamo exporter traces each graph: 6-20 s an architecture on 2 cores
@pytest.mark.parametrize("name", list(CONFIGS))
def test_onnx_runtime_equals_pytorch_at_another_batch_and_length(tmp_path, name):
    model = _model(name)
    result = export_onnx(model, tmp_path)
    assert result.max_difference is not None and result.max_difference < TOL  # the export's own check
    inputs = sample_inputs(model, *OTHER_SHAPE, seed=7)
    batch = inputs[next(iter(inputs))].shape[0]
    assert batch not in (EXPORT_SHAPE[0], CHECK_SHAPE[0])
    if "attention_mask" in inputs:
        assert inputs["input_ids"].shape[1] not in (EXPORT_SHAPE[1], CHECK_SHAPE[1])
        assert not bool(inputs["attention_mask"].all())  # padded rows: the graph must apply the mask
    got = run_onnx(tmp_path / MODEL_FILE, inputs)
    with torch.no_grad():
        want = model(**inputs)
    assert list(got) == list(signature(model)[1])
    for key, value in got.items():
        torch.testing.assert_close(torch.from_numpy(value), want[key], rtol=TOL, atol=TOL)
    if name == "t5":  # onnx.json names an encoder-decoder's inputs, outputs and axes
        meta = json.loads((tmp_path / META_FILE).read_text())
        assert meta["inputs"] == {"input_ids": ["batch", "source_sequence"],
                                  "attention_mask": ["batch", "source_sequence"],
                                  "decoder_input_ids": ["batch", "sequence"]}
        assert meta["outputs"] == {"logits": ["batch", "sequence", "97"]} and meta["max_difference"] < TOL


def test_padding_changes_the_graphs_output(tmp_path):
    """The mask is an input of the graph, not a constant traced from the sample (TorchScript's failure)."""
    model = _model("bert-classifier")
    export_onnx(model, tmp_path, check=False)
    inputs = sample_inputs(model, *OTHER_SHAPE, seed=3)
    padded = run_onnx(tmp_path / MODEL_FILE, inputs)["last_hidden_state"]
    inputs["attention_mask"] = torch.ones_like(inputs["attention_mask"])
    full = run_onnx(tmp_path / MODEL_FILE, inputs)["last_hidden_state"]
    assert abs(padded[0] - full[0]).max() < TOL  # row 0 has no padding
    assert abs(padded[-1] - full[-1]).max() > 1e-2  # the last row's real tokens no longer see its pads


def test_the_eager_guards_stay_outside_export():
    model = _model("gpt2")
    assert not tracing()
    with pytest.raises(TformerError, match="exceeds the model's max_positions"):
        model(torch.zeros(1, model.config.max_positions + 1, dtype=torch.long))


def test_the_metadata_of_an_unchecked_export(tmp_path):
    """check=False: no ONNX Runtime run, so no difference is recorded (the axes: the t5 case above)."""
    model = _model("gpt2")
    export_onnx(model, tmp_path, check=False)
    meta = json.loads((tmp_path / META_FILE).read_text())
    assert meta["inputs"] == {"input_ids": ["batch", "sequence"], "attention_mask": ["batch", "sequence"]}
    assert meta["outputs"] == {"logits": ["batch", "sequence", "97"]} and meta["max_difference"] is None
    assert sorted(p.name for p in tmp_path.iterdir()) == [MODEL_FILE, META_FILE]


def test_cli_exports_a_preset_and_a_checkpoint(tmp_path, capsys):
    out = tmp_path / "preset"
    sets = [x for kv in TINY for x in ("--set", kv)]
    assert main(["export", "--format", "onnx", "--preset", "distilbert-base", "--set", "task=token-classification",
                 "--set", "n_classes=5", *sets, "--out", str(out)]) == 0
    printed = capsys.readouterr().out
    assert "ONNX opset" in printed and "max |difference|" in printed
    meta = json.loads((out / META_FILE).read_text())
    assert meta["outputs"]["logits"] == ["batch", "sequence", "5"] and meta["max_difference"] < TOL
    model = _model("vit")
    save_model(model, tmp_path / "run")
    assert main(["export", "--format", "onnx", "--ckpt", str(tmp_path / "run"), "--out", str(tmp_path / "vit")]) == 0
    got = run_onnx(tmp_path / "vit" / MODEL_FILE, sample_inputs(model, 5, 0))
    assert got["logits"].shape == (5, 7)


@pytest.mark.parametrize("argv,words", [
    (["--format", "tflite", "--preset", "gpt2"], "--format tflite is unknown; choose one of: hf, onnx"),
    (["--format", "onnx", "--preset", "char-small", "--set", "arch=rnn"], "supports decoder, encoder"),
    (["--format", "onnx", "--preset", "gpt2", "--set", "attn_impl=tiled"], "'tiled' does not export to ONNX"),
    (["--ckpt", "run", "--set", "n_layers=1"], "--set overrides a --preset's fields"),
])
def test_bad_input_is_one_line_exit_2(tmp_path, capsys, argv, words):
    assert main(["export", *argv, "--out", str(tmp_path / "out")]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and words in err
    assert not (tmp_path / "out").exists()


def test_an_unwritable_out_is_one_line_exit_2(tmp_path, capsys):
    (tmp_path / "file").write_text("in the way")
    assert main(["export", "--format", "onnx", "--preset", "gpt2", "--out", str(tmp_path / "file" / "out")]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "is a file, not a folder; choose another --out" in err
