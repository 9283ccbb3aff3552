"""The training loop: it learns, resumes bit-identically after SIGKILL, and DDP equals one process."""

import json
import math

import pytest
import torch

from tformer.core.errors import TformerError
from tformer.cost.formulas import noam, warmup_cosine
from train_kit import losses as _losses, run as _run, weights as _weights


def test_loss_falls_and_metrics_are_logged(tmp_path, device):
    result = _run("--out", str(tmp_path), "--steps", "120", "--dropout", "0", "--device", str(device))
    assert result.returncode == 0, result.stderr
    records = [json.loads(line) for line in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    assert {"step", "train_loss", "lr", "tokens_per_s", "elapsed_s"} <= set(records[0])
    assert any("val_loss" in r for r in records)
    assert records[-1]["train_loss"] < 0.5 * math.log(32)  # chance is ln 32 = 3.47 nats; the floor is ~0.65
    assert (tmp_path / "metrics.csv").read_text().startswith("step,")
    assert (tmp_path / "model.safetensors").exists()


@pytest.mark.slow
def test_sigkill_then_resume_is_bit_identical(tmp_path):
    """SIGKILL after a checkpoint and in the middle of writing one: either way the resumed run equals a straight one."""
    straight, killed = tmp_path / "straight", tmp_path / "killed"
    assert _run("--out", str(straight)).returncode == 0
    died = _run("--out", str(killed), "--kill-at", "10")
    assert died.returncode == -9  # really killed, mid-run
    assert json.loads((killed / "checkpoint" / "state.json").read_text())["step"] == 10  # saved, then killed
    resumed = _run("--out", str(killed), "--resume")
    assert resumed.returncode == 0, resumed.stderr
    a, b = _weights(straight), _weights(killed)
    assert a.keys() == b.keys()
    assert all(torch.equal(a[k], b[k]) for k in a)
    assert _losses(straight) == _losses(killed)  # the log has no duplicated or missing steps
    # Killed halfway through writing step 10's checkpoint: step 5's stays whole, and resuming from it is exact.
    mid_save = tmp_path / "mid_save"
    assert _run("--out", str(mid_save), "--kill-in-save", "10").returncode == -9
    assert json.loads((mid_save / "checkpoint" / "state.json").read_text())["step"] == 5
    assert any(p.name.startswith(".checkpoint.tmp-") for p in mid_save.iterdir())  # really killed mid-write
    resumed = _run("--out", str(mid_save), "--resume")
    assert resumed.returncode == 0, resumed.stderr
    c = _weights(mid_save)
    assert all(torch.equal(a[k], c[k]) for k in a)
    assert _losses(straight) == _losses(mid_save)
    assert not [p.name for p in mid_save.iterdir() if ".tmp-" in p.name]  # the half-written one was cleared


@pytest.mark.slow
def test_ddp_two_processes_match_one_process(tmp_path):
    one, two = tmp_path / "one", tmp_path / "two"
    assert _run("--out", str(one), "--dropout", "0", "--steps", "10").returncode == 0
    result = _run("--out", str(two), "--dropout", "0", "--steps", "10", torchrun=2)
    assert result.returncode == 0, result.stderr[-2000:]
    assert _losses(one) == pytest.approx(_losses(two), rel=1e-5)
    a, b = _weights(one), _weights(two)
    assert all(torch.allclose(a[k], b[k], atol=1e-5) for k in a)


def test_gradient_accumulation_matches_the_full_batch(tmp_path, device):
    full, accum = tmp_path / "full", tmp_path / "accum"
    on = ("--device", str(device))
    assert _run("--out", str(full), "--dropout", "0", "--steps", "6", *on).returncode == 0
    assert _run("--out", str(accum), "--dropout", "0", "--steps", "6", "--accum", "4", *on).returncode == 0
    assert _losses(full) == pytest.approx(_losses(accum), rel=1e-5)


def test_resume_without_checkpoint_is_a_clear_error(tmp_path):
    result = _run("--out", str(tmp_path / "nothing"), "--resume")
    assert result.returncode != 0 and "no checkpoint" in result.stderr


def test_corrupt_checkpoint_is_a_clear_error(tmp_path):
    from tformer.core.config import ModelConfig
    from tformer.model import build
    from tformer.train.checkpoint import load_checkpoint

    assert _run("--out", str(tmp_path), "--steps", "5").returncode == 0
    (tmp_path / "checkpoint" / "model.safetensors").write_bytes(b"\x00garbage")
    model = build(ModelConfig(n_layers=2, d_model=32, n_heads=4, d_ff=64, vocab_size=32, max_positions=16,
                              dropout=0.1))
    with pytest.raises(TformerError, match="corrupt or incomplete"):
        load_checkpoint(tmp_path / "checkpoint", model)
    other = build(ModelConfig(n_layers=3, d_model=32, n_heads=4, d_ff=64, vocab_size=32, max_positions=16))
    with pytest.raises(TformerError, match="different model"):
        load_checkpoint(tmp_path / "checkpoint", other)


def test_schedules_match_the_papers():
    # Vaswani et al. 2017, eq. 3, with d_model 512 and 4000 warmup steps.
    assert noam(1, 512, 4000) == pytest.approx(512**-0.5 * 4000**-1.5)
    assert noam(4000, 512, 4000) == pytest.approx(512**-0.5 * 4000**-0.5)
    assert noam(16000, 512, 4000) == pytest.approx(noam(4000, 512, 4000) / 2)
    assert warmup_cosine(50, 1e-3, 100, 1000) == pytest.approx(5e-4)
    assert warmup_cosine(550, 1e-3, 100, 1000, 1e-4) == pytest.approx(5.5e-4)
    assert warmup_cosine(1000, 1e-3, 100, 1000, 1e-4) == pytest.approx(1e-4)


@pytest.mark.slow
def test_fsdp_two_processes_match_one_process_and_save_plain_weights(tmp_path):
    from safetensors.torch import load_model

    from tformer.core.config import ModelConfig
    from tformer.model import build

    one, two = tmp_path / "one", tmp_path / "two"
    # --accum 2 also covers FSDP's gradient-sync switch between micro-batches.
    assert _run("--out", str(one), "--dropout", "0", "--steps", "10", "--accum", "2").returncode == 0
    result = _run("--out", str(two), "--dropout", "0", "--steps", "10", "--accum", "2", "--fsdp", torchrun=2)
    assert result.returncode == 0, result.stderr[-2000:]
    assert _losses(one) == pytest.approx(_losses(two), rel=1e-5)
    a, b = _weights(one), _weights(two)
    assert a.keys() == b.keys() and all(torch.allclose(a[k], b[k], atol=1e-5) for k in a)
    plain = build(ModelConfig(n_layers=2, d_model=32, n_heads=4, d_ff=64, vocab_size=32, max_positions=16))
    missing, unexpected = load_model(plain, str(two / "model.safetensors"))
    assert not missing and not unexpected
    assert (tmp_path / "two" / "checkpoint" / "optimizer.safetensors").exists()


@pytest.mark.slow
def test_fsdp_run_killed_then_resumed_matches_one_process(tmp_path):
    one, two = tmp_path / "one", tmp_path / "two"
    assert _run("--out", str(one), "--dropout", "0", "--steps", "10").returncode == 0
    died = _run("--out", str(two), "--dropout", "0", "--steps", "10", "--fsdp", "--kill-at", "5", torchrun=2)
    assert died.returncode != 0
    assert json.loads((two / "checkpoint" / "state.json").read_text())["step"] == 5
    resumed = _run("--out", str(two), "--dropout", "0", "--steps", "10", "--fsdp", "--resume", torchrun=2)
    assert resumed.returncode == 0, resumed.stderr[-2000:]
    assert _losses(one) == pytest.approx(_losses(two), rel=1e-5)
    a, b = _weights(one), _weights(two)
    assert all(torch.allclose(a[k], b[k], atol=1e-5) for k in a)


def test_adam_steps_with_the_fused_kernel_and_old_checkpoints_keep_their_own():
    from tformer.core.config import ModelConfig
    from tformer.model import build
    from tformer.train.optim import fused_supported, make_optimizer, parameter_groups

    model = build(ModelConfig(n_layers=1, d_model=16, n_heads=2, d_ff=32, vocab_size=32, max_positions=8))
    for name in ("adamw", "adam"):
        assert all(g["fused"] for g in make_optimizer(model, name, 1e-3).param_groups)
    assert not make_optimizer(model, "sgd", 1e-3).defaults["fused"]  # SGD keeps torch's default path
    assert not fused_supported([]) and not fused_supported([torch.zeros(2, dtype=torch.int64)])
    # A checkpoint written before the fused kernel resumes on the path it was trained with (exact resume).
    old = torch.optim.AdamW(parameter_groups(model, 0.1), lr=1e-3)  # torch's default path on a CPU
    model(torch.zeros(1, 4, dtype=torch.long)).logits.sum().backward()
    old.step()
    new = make_optimizer(model, "adamw", 1e-3)
    new.load_state_dict(old.state_dict())
    assert not any(g["fused"] for g in new.param_groups)

