"""tformer prune: a checkpoint made smaller (heads, FFN neurons removed) or sparser (weights zeroed), saved as a
checkpoint the other commands read, with the tokenizer beside it; bad requests are one line and exit 2."""

from __future__ import annotations

import pytest
import torch

from tformer.cli import main
from tformer.core.config import preset
from tformer.data import tokenizers
from tformer.data.tokenizers import CharTokenizer
from tformer.interop.checkpoint import load_model
from tformer.model import build
from tformer.train.checkpoint import save_weights


@pytest.fixture()
def run(tmp_path):
    torch.manual_seed(0)
    config = preset("char-small").with_overrides(["n_layers=2", "d_model=48", "n_heads=4", "d_ff=96", "vocab_size=20"])
    model = build(config).eval()
    save_weights(model, tmp_path / "run")
    CharTokenizer("abcdefgh").save(tmp_path / "run" / "tokenizer")
    return model, tmp_path / "run"


def test_structured_pruning_saves_a_smaller_model_the_loader_reads(run, tmp_path, capsys):
    model, src = run
    out = tmp_path / "pruned"
    assert main(["prune", "--ckpt", str(src), "--heads", "1", "--ffn", "0.25", "--out", str(out)]) == 0
    printed = capsys.readouterr().out
    pruned = load_model(out)
    assert (pruned.config.n_heads, pruned.config.head_dim, pruned.config.d_ff) == (3, 12, 72)
    before, after = (sum(p.numel() for p in m.parameters()) for m in (model, pruned))
    assert f"{before:,} -> {after:,} parameters" in printed and after < before
    assert tokenizers.load(out).encode("badcafe") == CharTokenizer("abcdefgh").encode("badcafe")
    ids = torch.randint(0, 20, (2, 9), generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        assert pruned(ids).logits.shape == model(ids).logits.shape


@pytest.mark.parametrize("per_layer", [False, True])
def test_magnitude_pruning_zeroes_the_asked_share_and_keeps_shapes(run, tmp_path, capsys, per_layer):
    model, src = run
    out = tmp_path / "sparse"
    assert main(["prune", "--ckpt", str(src), "--sparsity", "0.5", "--out", str(out)]
                + (["--per-layer"] if per_layer else [])) == 0
    assert "50.0% of the stacks' Linear weights zeroed" in capsys.readouterr().out
    sparse = load_model(out)
    assert sparse.config == model.config
    weights = [p for n, p in sparse.named_parameters() if n.endswith("weight") and p.dim() == 2 and ".layers." in n]
    zeros = sum(int((w == 0).sum()) for w in weights) / sum(w.numel() for w in weights)
    assert zeros == pytest.approx(0.5, abs=0.01)


@pytest.mark.parametrize("argv,words", [
    ([], "nothing to prune"),
    (["--heads", "1", "--sparsity", "0.3"], "choose one kind"),
    (["--per-layer", "--heads", "1"], "--per-layer applies to --sparsity"),
    (["--sparsity", "1.5"], "sparsity"),
    (["--heads", "4"], "leaves none"),
    (["--ffn", "1.0"], "FFN fraction"),
])
def test_bad_requests_are_one_line_and_exit_2(run, tmp_path, capsys, argv, words):
    _, src = run
    assert main(["prune", "--ckpt", str(src), "--out", str(tmp_path / "x")] + argv) == 2
    err = capsys.readouterr().err.strip()
    assert words in err and "\n" not in err and "Traceback" not in err
