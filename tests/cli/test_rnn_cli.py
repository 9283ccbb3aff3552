"""arch='rnn' from the command line: train, generate (cached == rerun), count, and one-line refusals."""

import json

import pytest
from forked_cli import run_tformer

RNN = {"arch": "rnn", "cell": "lstm", "vocab_size": 65, "d_model": 16, "d_hidden": 24, "n_layers": 2,
       "max_positions": 32}


def _cli(*args, timeout=300):
    return run_tformer(args, timeout=timeout)


def _config(tmp_path, **changes):
    path = tmp_path / "rnn.json"
    path.write_text(json.dumps({**RNN, **changes}))
    return path


@pytest.fixture(scope="module")
def trained(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("rnn")
    out = tmp / "run"
    result = _cli("train", "--config", _config(tmp), "--out", out, "--max-steps", 6, "--batch-size", 4,
                  "--seq-len", 16, "--eval-interval", 3, "--eval-batches", 1, "--no-progress")
    assert result.returncode == 0, result.stderr[-2000:]
    return out


def test_train_writes_a_checkpoint_of_the_rnn(trained):
    saved = json.loads((trained / "config.json").read_text())
    assert saved["arch"] == "rnn" and saved["cell"] == "lstm" and saved["d_hidden"] == 24
    assert (trained / "model.safetensors").exists()


def test_generate_with_the_state_equals_rerunning_every_token(trained):
    runs = []
    for extra in ([], ["--no-cache"]):
        result = _cli("generate", "--ckpt", trained, "--prompt", "ROMEO:", "--prompt", "Hi", "--max-new-tokens", 8,
                      "--greedy", "--json", *extra)
        assert result.returncode == 0, result.stderr[-2000:]
        runs.append(json.loads(result.stdout))
    cached, rerun = runs
    assert [s["ids"] for s in cached["sequences"]] == [s["ids"] for s in rerun["sequences"]]
    assert cached["cache_bytes"] == 2 * 2 * 2 * 24 * 4  # h and c, 2 layers, 2 rows, fp32: fixed size
    beams = _cli("generate", "--ckpt", trained, "--prompt", "ROMEO:", "--max-new-tokens", 4, "--num-beams", 3)
    assert beams.returncode == 0, beams.stderr[-2000:]


def test_generate_refuses_compile_in_one_line(trained):
    result = _cli("generate", "--ckpt", trained, "--prompt", "A", "--max-new-tokens", 2, "--compile")
    assert result.returncode == 2
    assert result.stderr.strip().count("\n") == 0 and "recurrent model" in result.stderr


def test_count_shows_the_recurrent_figures(tmp_path):
    result = _cli("count", "--config", _config(tmp_path), "--seq", 20, "--json")
    assert result.returncode == 0, result.stderr
    rec = json.loads(result.stdout)["recurrent"]
    assert rec["params_exact"] - rec["params_course"] == 4 * 24 * 2  # one extra bias vector per gate per layer
    assert rec["sequential_steps_per_layer"] == 20 and rec["sequential_steps_attention_layer"] == 1
    text = _cli("count", "--config", _config(tmp_path), "--seq", 20)
    assert text.returncode == 0 and "sequential steps per layer" in text.stdout


@pytest.mark.parametrize("changes, message", [
    ({"cell": "lstn"}, "cell='lstn' is unknown (did you mean 'lstm'?); choose one of: lstm, gru, rnn"),
    ({"d_hidden": 0}, "d_hidden must be at least 1, got 0"),
])
def test_bad_cell_or_width_is_one_line_and_exit_2(tmp_path, changes, message):
    for command in (["count"], ["train", "--max-steps", 1, "--out", tmp_path / "o"]):
        result = _cli(*command, "--config", _config(tmp_path, **changes))
        assert result.returncode == 2
        assert message in result.stderr and result.stderr.strip().count("\n") == 0
