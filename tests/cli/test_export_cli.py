"""tformer export: a training run's weights as a Hugging Face folder that transformers loads to the same logits."""

from __future__ import annotations

import pytest
import torch

from tformer.cli import main
from tformer.core.config import preset
from tformer.data import tokenizers
from tformer.data.tokenizers import CharTokenizer
from tformer.model import build
from tformer.train.checkpoint import save_weights

transformers = pytest.importorskip("transformers")


def _run_dir(tmp_path, config):
    torch.manual_seed(0)
    model = build(config).eval()
    run = tmp_path / "run"
    save_weights(model, run)  # what `tformer train` leaves in its --out folder
    CharTokenizer("abcdefgh").save(run / "tokenizer")
    return model, run


@pytest.mark.parametrize("name,cls", [("char-small", "AutoModelForCausalLM"), ("t5-small", "AutoModelForSeq2SeqLM")])
def test_exported_run_loads_in_transformers_with_the_same_logits(tmp_path, capsys, name, cls):
    t5 = ["n_decoder_layers=2", "head_dim=16", "attention_dropout=0.1", "activation_dropout=0.1"]
    config = preset(name).with_overrides(["n_layers=2", "d_model=64", "n_heads=4", "d_ff=128", "vocab_size=90"]
                                         + (t5 if name == "t5-small" else []))
    ours, run = _run_dir(tmp_path, config)
    out = tmp_path / "hf"
    assert main(["export", "--ckpt", str(run), "--out", str(out)]) == 0
    assert "exported" in capsys.readouterr().out
    assert tokenizers.load(out).encode("badcafe") == CharTokenizer("abcdefgh").encode("badcafe")
    theirs = getattr(transformers, cls).from_pretrained(out).eval()
    ids = torch.randint(0, 90, (2, 7), generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        if config.arch == "encoder-decoder":
            dec = ids[:, :5]
            got, want = ours(ids, decoder_input_ids=dec).logits, theirs(input_ids=ids, decoder_input_ids=dec).logits
        else:
            got, want = ours(ids).logits, theirs(ids).logits
    torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-4)


def test_export_errors_are_one_line_exit_2(tmp_path, capsys):
    assert main(["export", "--ckpt", str(tmp_path / "nowhere"), "--out", str(tmp_path / "hf")]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "does not exist" in err
    _, run = _run_dir(tmp_path, preset("char-small").with_overrides(["n_layers=1"]))
    assert main(["export", "--ckpt", str(run), "--out", str(run)]) == 2
    assert "itself; inputs are never overwritten" in capsys.readouterr().err
    assert not (tmp_path / "hf").exists()  # nothing half-written
