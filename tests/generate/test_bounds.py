"""generate refuses, before anything is allocated, a request that cannot finish on this machine."""

from __future__ import annotations

import io
import json
from contextlib import redirect_stderr, redirect_stdout

import pytest
import torch
from safetensors.torch import save_model

from tformer.cli import main
from tformer.core.config import ModelConfig
from tformer.core.errors import TformerError
from tformer.generate import generate, inputs
from tformer.generate.sampling import apply_temperature, check_temperature
from tformer.model import build

TINY = dict(n_layers=1, d_model=8, n_heads=2, d_ff=16, vocab_size=16, max_positions=16)


@pytest.fixture(scope="module")
def model():
    torch.manual_seed(0)
    return build(ModelConfig(**TINY, eos_token_id=3)).eval()


@pytest.fixture(scope="module")
def ckpt(tmp_path_factory, model):
    path = tmp_path_factory.mktemp("bounds") / "tiny"
    path.mkdir()
    save_model(model, str(path / "model.safetensors"))
    (path / "config.json").write_text(json.dumps(model.config.to_dict()))
    return path


def _error(argv) -> str:
    err = io.StringIO()
    with redirect_stdout(io.StringIO()), redirect_stderr(err):
        assert main(argv) == 2
    lines = err.getvalue().strip().splitlines()
    assert len(lines) == 1, lines
    return lines[0]


def test_more_beams_than_vocabulary_tokens_is_refused(model, ckpt):
    with pytest.raises(TformerError, match="more than the 16 tokens of the vocabulary"):
        generate(model, [1, 2, 3], num_beams=17)
    # The input that hung the fuzz: a million beams of a 16-token vocabulary ran for minutes.
    line = _error(["generate", "--ckpt", str(ckpt), "--prompt-ids", "1,2,3", "--num-beams=1000000"])
    assert "--num-beams 1000000" in line and "at most 16" in line
    assert len(generate(model, [1, 2, 3], num_beams=16, max_new_tokens=2).sequences) == 1  # the edge is fine


def test_more_rows_than_the_limit_is_refused(ckpt):
    line = _error(["generate", "--ckpt", str(ckpt), "--prompt-ids", "1,2,3", "--batch", str(inputs.MAX_ROWS),
                   "--num-beams", "2"])
    assert "131,072 rows" in line and "lower --batch or --num-beams" in line


@pytest.mark.parametrize("extra, hint", [([], "lower --batch, --num-beams or --max-new-tokens"),
                                         (["--no-cache"], "drop --no-cache")])
def test_more_memory_than_the_machine_has_free_is_refused(ckpt, monkeypatch, extra, hint):
    monkeypatch.setattr(inputs, "available_memory_bytes", lambda: 1000)
    line = _error(["generate", "--ckpt", str(ckpt), "--prompt-ids", "1,2,3", "--batch", "8", *extra])
    assert "needs at least" in line and "has 1 kB free" in line
    assert hint in line


def test_the_memory_estimate_grows_with_rows_tokens_and_no_cache():
    from tformer.cost.memory import generation_bytes
    c = ModelConfig(**TINY)
    one = generation_bytes(c, 1, 16, 3)["total"]
    assert generation_bytes(c, 2, 16, 3)["total"] == 2 * one
    assert generation_bytes(c, 1, 32, 3)["total"] > one
    assert generation_bytes(c, 1, 16, 3, use_cache=False)["kv_cache"] == 0
    assert generation_bytes(c, 1, 16, 3, use_cache=False)["forward"] > generation_bytes(c, 1, 16, 3)["forward"]


def test_prompt_ids_outside_the_vocabulary_are_refused(model, ckpt):
    with pytest.raises(TformerError, match=r"token id 16 is outside the vocabulary \[0, 16\)"):
        generate(model, [1, 16])
    assert "token id -1" in _error(["generate", "--ckpt", str(ckpt), "--prompt-ids=-1", "--repetition-penalty=2"])


def test_a_tiny_temperature_samples_the_top_token_and_an_infinite_one_is_refused(model):
    logits = torch.tensor([[1.0, 3.0, 2.0], [0.5, -1.0, 0.25]])
    probs = torch.softmax(apply_temperature(logits, 4e-246), dim=-1)
    assert torch.equal(probs, torch.tensor([[0.0, 1.0, 0.0], [1.0, 0.0, 0.0]]))
    out = generate(model, [1, 2, 3], do_sample=True, temperature=1e-300, seed=0, max_new_tokens=4)
    assert out.sequences == generate(model, [1, 2, 3], max_new_tokens=4).sequences  # as greedy
    with pytest.raises(TformerError, match="temperature must be finite"):
        check_temperature(float("inf"))


def test_a_tiny_repetition_penalty_keeps_the_distribution_finite(model):
    out = generate(model, [1, 2, 3], do_sample=True, repetition_penalty=1.2e-278, seed=0, max_new_tokens=4)
    assert len(out.sequences[0]) == 4  # found by the fuzz: a NaN distribution reached torch.multinomial
    with pytest.raises(TformerError, match="positive and finite"):
        generate(model, [1, 2, 3], repetition_penalty=float("inf"))
