"""arch='rnn-seq2seq' from the command line: train on the seq2seq data (with resume), translate from the checkpoint
(greedy, cached == rerun, beams), count, and one-line refusals with exit status 2."""

import json

import pytest
from forked_cli import run_tformer

S2S = {"arch": "rnn-seq2seq", "cell": "gru", "rnn_attention": "luong-general", "bidirectional": True,
       "vocab_size": 64, "d_model": 16, "d_hidden": 24, "n_layers": 1, "max_positions": 32}


def _cli(*args, timeout=300):
    return run_tformer(args, timeout=timeout)


def _config(tmp_path, **changes):
    path = tmp_path / "s2s.json"
    path.write_text(json.dumps({**S2S, **changes}))
    return path


@pytest.fixture(scope="module")
def trained(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("s2s")
    out = tmp / "run"
    common = ["--config", _config(tmp), "--data", "reverse", "--out", out, "--batch-size", 4, "--seq-len", 16,
              "--eval-interval", 2, "--eval-batches", 1, "--no-progress"]
    first = _cli("train", *common, "--max-steps", 2)
    assert first.returncode == 0, first.stderr[-2000:]
    resumed = _cli("train", *common, "--max-steps", 4, "--resume")
    assert resumed.returncode == 0, resumed.stderr[-2000:]
    return out


def test_train_writes_and_resumes_a_checkpoint_of_the_model(trained):
    saved = json.loads((trained / "config.json").read_text())
    assert saved["arch"] == "rnn-seq2seq" and saved["rnn_attention"] == "luong-general" and saved["bidirectional"]
    assert saved["decoder_start_token_id"] is not None and (trained / "model.safetensors").exists()


def test_translate_from_the_checkpoint(trained):
    runs = []
    for extra in ([], ["--no-cache"]):
        result = _cli("translate", "--ckpt", trained, "--source-ids", "5,6,7,8", "--source-ids", "9,10",
                      "--max-new-tokens", 6, "--json", *extra)
        assert result.returncode == 0, result.stderr[-2000:]
        runs.append(json.loads(result.stdout))
    assert [s["ids"] for s in runs[0]["sequences"]] == [s["ids"] for s in runs[1]["sequences"]]
    beams = _cli("translate", "--ckpt", trained, "--source-ids", "5,6,7", "--max-new-tokens", 4, "--num-beams", 3)
    assert beams.returncode == 0, beams.stderr[-2000:]


def test_generate_points_to_translate_and_compile_refuses_in_one_line(trained):
    result = _cli("generate", "--ckpt", trained, "--prompt-ids", "5", "--max-new-tokens", 2)
    assert result.returncode == 2 and "tformer translate" in result.stderr
    result = _cli("translate", "--ckpt", trained, "--source-ids", "5,6", "--max-new-tokens", 2, "--compile")
    assert result.returncode == 2
    assert result.stderr.strip().count("\n") == 0 and "recurrent model" in result.stderr


def test_count_shows_the_attention_figures(tmp_path):
    result = _cli("count", "--config", _config(tmp_path), "--seq", 20, "--json")
    assert result.returncode == 0, result.stderr
    rec = json.loads(result.stdout)["recurrent"]
    assert rec["attention"] == "luong-general" and rec["attention_params"] == 3 * 24 * 24
    text = _cli("count", "--config", _config(tmp_path), "--seq", 20)
    assert text.returncode == 0 and "matmul per decoder step (grows with the source)" in text.stdout


@pytest.mark.parametrize("changes, message", [
    ({"rnn_attention": "additive"}, "rnn_attention='additive' is unknown; choose one of: bahdanau, luong-dot, "
                                    "luong-general, none"),
    ({"arch": "rnn", "rnn_attention": "bahdanau", "bidirectional": False},
     "rnn_attention (Bahdanau or Luong) only applies to arch='rnn-seq2seq'"),
    ({"d_hidden": 0}, "d_hidden must be at least 1, got 0"),
])
def test_bad_config_is_one_line_and_exit_2(tmp_path, changes, message):
    for command in (["count"], ["train", "--max-steps", 1, "--data", "reverse", "--out", tmp_path / "o"]):
        result = _cli(*command, "--config", _config(tmp_path, **changes))
        assert result.returncode == 2, result.stderr[-500:]
        assert message in result.stderr and result.stderr.strip().count("\n") == 0
