"""`--compile` training: the same loss curve as eager, plain checkpoints, exact resume, no recompiles.

One tiny decoder of odd sizes (d_model 40, head dim 10, vocab 61), fp32, dropout 0, with gradient
accumulation, an evaluation every 5 steps and a sample every 3 (the eager model generates while the
compiled one trains): what a user's run does between optimizer steps. Each compiled process costs one
compilation (10-30 s on a 2-core CPU), so the four compiled runs share one test.
"""

import json
import shutil

import pytest
import torch
from safetensors.torch import load_file

from train_kit import losses, run, weights

TINY = ["--dropout", "0", "--d-model", "40", "--vocab", "61", "--accum", "2", "--sample-interval", "3",
        "--steps", "10"]
# Inductor may fuse and reorder float sums (softmax, layer norm, the backward's reductions), so compiled and
# eager can differ by rounding that AdamW carries from step to step (at these sizes they often agree to the
# bit). A real error (a missed op, a wrong scale, a stale graph) moves the loss by far more than 1e-4.
LOSS_RTOL = 1e-4


def _ok(result):
    assert result.returncode == 0, result.stderr[-3000:]


def _same_weights(a: dict, b: dict) -> bool:
    return a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)


@pytest.mark.slow
def test_compiled_training_matches_eager_and_resumes_exactly(tmp_path):
    eager, compiled, killed = tmp_path / "eager", tmp_path / "compiled", tmp_path / "killed"
    counts = tmp_path / "compiles.json"
    _ok(run("--out", str(eager), *TINY))
    _ok(run("--out", str(compiled), *TINY, "--compile", "--compiles", str(counts)))

    # The loss curve: equal to eager's within rounding, step by step.
    straight = losses(compiled)
    assert len(straight) == 10
    assert straight == pytest.approx(losses(eager), rel=LOSS_RTOL)
    # Really compiled, as one graph (a graph break would compile the model in pieces), and only at the first
    # step: micro-batches, evaluation and sampling between steps reuse it (a recompile would add a frame later).
    frames = json.loads(counts.read_text())
    assert frames == [1] * 10, frames

    # The checkpoint and the exported weights carry the model's own names, not the compiled wrapper's.
    plain = load_file(str(eager / "checkpoint" / "model.safetensors")).keys()
    assert load_file(str(compiled / "checkpoint" / "model.safetensors")).keys() == plain
    assert weights(compiled).keys() == weights(eager).keys()
    assert not [k for k in plain if "_orig_mod" in k]

    # Killed after step 5's checkpoint, resumed compiled: bit-identical to the run that never stopped.
    assert run("--out", str(killed), *TINY, "--compile", "--kill-at", "5").returncode == -9
    in_eager = tmp_path / "killed_then_eager"
    shutil.copytree(killed, in_eager)
    _ok(run("--out", str(killed), *TINY, "--compile", "--resume"))
    assert _same_weights(weights(compiled), weights(killed))
    assert losses(killed) == straight

    # The same checkpoint resumed without --compile: the eager model takes it as it is (strict names) and
    # goes on from step 5 on the compiled curve, within the same rounding.
    _ok(run("--out", str(in_eager), *TINY, "--resume"))
    resumed = losses(in_eager)
    assert resumed[:5] == straight[:5]  # the log kept the compiled run's first five steps, no more
    assert resumed[5:] == pytest.approx(straight[5:], rel=LOSS_RTOL)
    final = weights(in_eager)
    assert final.keys() == weights(compiled).keys()
    assert all(torch.allclose(final[k], weights(compiled)[k], rtol=1e-3, atol=1e-5) for k in final)
