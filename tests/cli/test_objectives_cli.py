"""`tformer train --objective`: each pretraining objective trains a few steps from the CLI on a tiny model,
resumes bit-exact, and an objective the architecture cannot train is one line and exit 2."""

import json
import os

import pytest
import torch
from forked_cli import run_tformer
from safetensors.torch import load_file

COMMON = ["--batch-size", "4", "--warmup", "2", "--eval-batches", "1", "--log-interval", "1", "--no-progress",
          "--seq-len", "32", "--eval-interval", "2"]
TINY_T5 = ["--preset", "t5-small", "--set", "n_layers=1", "--set", "n_decoder_layers=1", "--set", "d_model=16",
           "--set", "n_heads=2", "--set", "d_ff=32", "--set", "head_dim=8"]
TINY_BART = ["--preset", "bart-base", "--set", "n_layers=1", "--set", "n_decoder_layers=1", "--set", "d_model=16",
             "--set", "n_heads=2", "--set", "d_ff=32", "--set", "max_positions=32"]
TINY_GPT = ["--set", "n_layers=1", "--set", "d_model=16", "--set", "n_heads=2", "--set", "d_ff=32",
            "--set", "max_positions=32"]
TINY_BERT = ["--preset", "bert-base", "--set", "n_layers=1", "--set", "d_model=16", "--set", "n_heads=2",
             "--set", "d_ff=32", "--set", "max_positions=32"]


@pytest.fixture
def corpus(tmp_path):
    path = tmp_path / "corpus.txt"
    path.write_text("The quick brown fox jumps over the lazy dog. A second sentence follows it. " * 200)
    return path


def _train(tmp_path, *args):
    env = {**os.environ, "TFORMER_CACHE": str(tmp_path / "cache"), "OMP_NUM_THREADS": "1"}
    return run_tformer(["train", *COMMON, *args], timeout=300, env=env)


@pytest.mark.parametrize("model, objective", [(TINY_T5, "span-corruption"), (TINY_BART, "denoise"),
                                              (TINY_T5, "denoise"), (TINY_GPT, "prefix-lm")])
def test_objective_trains_with_progress_checkpoint_and_weights(tmp_path, corpus, model, objective):
    out = tmp_path / "run"
    result = _train(tmp_path, *model, "--objective", objective, "--data", str(corpus), "--max-steps", "3",
                    "--out", str(out))
    assert result.returncode == 0, result.stderr[-2000:]
    assert f"{objective} objective" in result.stdout and "step      3/3" in result.stdout
    assert (out / "checkpoint" / "state.json").exists() and (out / "model.safetensors").exists()
    assert json.loads((out / "train_args.json").read_text())["objective"] == objective
    losses = [json.loads(line)["train_loss"] for line in (out / "metrics.jsonl").read_text().splitlines()]
    assert len(losses) == 3 and all(0 < x < 20 for x in losses)


@pytest.mark.parametrize("model, objective", [(TINY_T5, "span-corruption"), (TINY_GPT, "prefix-lm"),
                                              (TINY_BERT, "mlm+nsp"), (TINY_BERT, "mlm+sop")])
def test_objective_resumes_bit_exact(tmp_path, corpus, model, objective):
    straight, resumed = tmp_path / "straight", tmp_path / "resumed"
    args = [*model, "--objective", objective, "--data", str(corpus), "--ckpt-interval", "2"]
    assert _train(tmp_path, *args, "--max-steps", "4", "--out", str(straight)).returncode == 0
    assert _train(tmp_path, *args, "--max-steps", "2", "--out", str(resumed)).returncode == 0
    again = _train(tmp_path, "--resume", "--max-steps", "4", "--out", str(resumed))
    assert again.returncode == 0, again.stderr[-2000:]
    assert "resumed from step 2" in again.stdout
    a, b = load_file(str(straight / "model.safetensors")), load_file(str(resumed / "model.safetensors"))
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)


@pytest.mark.parametrize("model, objective, message", [
    (TINY_GPT, "span-corruption", "--objective span-corruption trains an encoder-decoder model, but this is a "
                                  "decoder-only model"),
    (TINY_BERT, "denoise", "trains an encoder-decoder model, but this is an encoder-only model"),
    (TINY_BERT, "prefix-lm", "--objective prefix-lm trains a decoder-only model, but this is an encoder-only model"),
    (TINY_T5, "prefix-lm", "trains a decoder-only model, but this is an encoder-decoder model"),
    ([*TINY_GPT, "--set", "attn_impl=tiled"], "prefix-lm", "--set attn_impl=sdpa"),
    (TINY_GPT, "no-such", "unknown objective 'no-such'"),
])
def test_objective_the_model_cannot_train_is_one_line_exit_2(tmp_path, corpus, model, objective, message):
    result = _train(tmp_path, *model, "--objective", objective, "--data", str(corpus), "--max-steps", "1",
                    "--out", str(tmp_path / "run"))
    assert result.returncode == 2, result.stderr
    assert message in result.stderr
    assert "Traceback" not in result.stderr and result.stderr.strip().count("\n") == 0


# Sentence-pair objectives (BERT's NSP, ALBERT's SOP) ------------------------------------------------------------
TINY_ALBERT = ["--preset", "albert-base", "--set", "n_layers=2", "--set", "d_model=16", "--set", "n_heads=2",
               "--set", "d_ff=32", "--set", "embed_dim=8", "--set", "max_positions=32"]


@pytest.mark.parametrize("model, objective", [(TINY_BERT, "mlm+nsp"), (TINY_ALBERT, "mlm+sop")])
def test_pair_objective_trains_with_heads_switched_on_and_pair_accuracy(tmp_path, corpus, model, objective):
    out = tmp_path / "run"
    result = _train(tmp_path, *model, "--objective", objective, "--data", str(corpus), "--max-steps", "3",
                    "--out", str(out))
    assert result.returncode == 0, result.stderr[-2000:]
    assert f"{objective} objective (pooler + 2-class pair head + MLM head switched on)" in result.stdout
    assert "step      3/3" in result.stdout and "pair acc" in result.stdout
    weights = load_file(str(out / "model.safetensors"))
    assert weights["pair_head.weight"].shape == (2, 16) and "pooler.dense.weight" in weights
    records = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    assert len(records) == 3 and 0 <= records[-1]["val_pair_accuracy"] <= 1




@pytest.mark.parametrize("model, objective, message", [
    (TINY_GPT, "mlm+nsp", "--objective mlm+nsp trains an encoder-only model, but this is a decoder-only model"),
    (TINY_T5, "mlm+sop", "--objective mlm+sop trains an encoder-only model, but this is an encoder-decoder model"),
    ([*TINY_BERT, "--set", "type_vocab_size=0"], "mlm+nsp", "needs segment ids 0 and 1, but this config has "
                                                            "type_vocab_size 0; --set type_vocab_size=2"),
    ([*TINY_BERT, "--set", "type_vocab_size=1"], "mlm+sop", "--set type_vocab_size=2"),
])
def test_pair_objective_the_model_cannot_train_is_one_line_exit_2(tmp_path, corpus, model, objective, message):
    result = _train(tmp_path, *model, "--objective", objective, "--data", str(corpus), "--max-steps", "1",
                    "--out", str(tmp_path / "run"))
    assert result.returncode == 2, result.stderr
    assert message in result.stderr
    assert "Traceback" not in result.stderr and result.stderr.strip().count("\n") == 0
