"""Perplexity with llama.cpp's protocol: consecutive chunks of ctx tokens, each from an empty context, the first
token replaced by BOS when the tokenizer adds one, only the second half scored (positions ctx/2 .. ctx-2
predicting the next token). Checked against the same quantity written out position by position, and the CLI."""

from __future__ import annotations

import json
import math

import pytest
import torch

from tformer.cli import main
from tformer.core.config import ModelConfig
from tformer.core.errors import TformerError
from tformer.measure.perplexity import chunk_ids, perplexity
from tformer.model import build


def _model():
    torch.manual_seed(0)
    return build(ModelConfig(arch="decoder", vocab_size=30, d_model=16, n_heads=2, n_layers=1, d_ff=32,
                             max_positions=32, position="rope", norm="rmsnorm")).eval()


@pytest.mark.parametrize("bos", [None, 0])
def test_equals_the_protocol_written_out(bos):
    model = _model()
    ids = torch.randint(1, 30, (77,), generator=torch.Generator().manual_seed(1)).tolist()
    ctx = 16
    got = perplexity(model, ids, ctx=ctx, bos_id=bos, batch=3)
    nll, n = 0.0, 0
    for c in range(len(ids) // ctx):  # 4 chunks; the last 13 tokens are dropped
        chunk = list(ids[c * ctx:(c + 1) * ctx])
        if bos is not None:
            chunk[0] = bos
        with torch.no_grad():
            logp = model(torch.tensor([chunk])).logits[0].log_softmax(-1)
        for i in range(ctx // 2, ctx - 1):
            nll -= logp[i, chunk[i + 1]].item()
            n += 1
    assert got.chunks == 4 and got.scored_tokens == n == 4 * 7
    assert got.perplexity == pytest.approx(math.exp(nll / n), rel=1e-6)
    assert got.chunk_ppl[-1] == pytest.approx(got.perplexity)


def test_batching_does_not_change_the_figure():
    model, ids = _model(), list(range(1, 30)) * 5
    assert perplexity(model, ids, ctx=16, batch=1).perplexity == pytest.approx(
        perplexity(model, ids, ctx=16, batch=8).perplexity, rel=1e-6)


@pytest.mark.parametrize("ids,ctx,words", [(list(range(10)), 16, "fewer than one chunk"),
                                           (list(range(100)), 15, "even number"),
                                           (list(range(100)), 2, "even number")])
def test_bad_settings_are_one_line(ids, ctx, words):
    with pytest.raises(TformerError, match=words) as err:
        chunk_ids(ids, ctx, None)
    assert "\n" not in str(err.value)


def test_cli_on_a_local_text(tmp_path, capsys):
    from tiny_checkpoint import write_checkpoint

    text = "to be or not to be, that is the question. " * 20
    write_checkpoint(tmp_path / "ckpt", "decoder", True, text, 32)
    (tmp_path / "t.txt").write_text(text)
    assert main(["perplexity", "--ckpt", str(tmp_path / "ckpt"), "--data", str(tmp_path / "t.txt"), "--ctx", "16",
                 "--chunks", "5", "--json"]) == 0
    row = json.loads(capsys.readouterr().out)
    assert row["chunks"] == 5 and row["scored_tokens"] == 5 * 7 and math.isfinite(row["perplexity"])
    assert main(["perplexity", "--ckpt", str(tmp_path / "ckpt"), "--data", str(tmp_path / "t.txt"),
                 "--ctx", "64"]) == 2
    assert "exceeds the model's context" in capsys.readouterr().err
