"""Distillation: the loss against a hand computation and torch's kl_div, the T^2 gradient scale, the student built
from chosen teacher layers (decoder, encoder, encoder-decoder), and the training loop running the distillation loss."""

from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F
from fixed_source import FixedTokenSource

from tformer.adapt.distill import DistillRunner, distillation_loss, every_other, student_from_teacher
from tformer.core.config import ModelConfig
from tformer.core.errors import TformerError
from tformer.model import build
from tformer.train.loop import TrainArgs, Trainer


def _softmax(row, t):
    e = [math.exp(x / t) for x in row]
    return [x / sum(e) for x in e]


def test_loss_equals_a_hand_computation():
    student = torch.tensor([[[1.0, 2.0, 0.5], [0.0, -1.0, 3.0], [2.0, 2.0, 2.0]]])
    teacher = torch.tensor([[[0.5, 2.5, 0.0], [1.0, 0.0, 2.0], [9.0, 9.0, 0.0]]])
    labels = torch.tensor([[1, 2, -100]])  # the last position is not scored
    alpha, t = 0.3, 2.0
    ce = kl = 0.0
    for s_row, t_row, y in zip(student[0, :2].tolist(), teacher[0, :2].tolist(), (1, 2)):
        ce -= math.log(_softmax(s_row, 1.0)[y]) / 2
        p, q = _softmax(t_row, t), _softmax(s_row, t)
        kl += sum(pi * math.log(pi / qi) for pi, qi in zip(p, q)) / 2
    expected = alpha * ce + (1 - alpha) * t * t * kl
    assert distillation_loss(student, teacher, labels, alpha, t).item() == pytest.approx(expected, rel=1e-6)


def test_loss_equals_torch_kl_div_and_alpha_one_is_plain_cross_entropy():
    torch.manual_seed(0)
    s, te = torch.randn(3, 5, 11), torch.randn(3, 5, 11)
    labels = torch.randint(0, 11, (3, 5))
    labels[0, :2] = -100
    keep = labels != -100
    t = 3.0
    kl = F.kl_div(F.log_softmax(s[keep] / t, -1), F.softmax(te[keep] / t, -1), reduction="sum") / keep.sum()
    assert distillation_loss(s, te, labels, 0.0, t).item() == pytest.approx(t * t * kl.item(), rel=1e-5)
    ce = F.cross_entropy(s.reshape(-1, 11), labels.reshape(-1), ignore_index=-100)
    assert distillation_loss(s, te, labels, 1.0, t).item() == pytest.approx(ce.item(), rel=1e-6)
    assert distillation_loss(s, s, labels, 0.0, t).item() == pytest.approx(0.0, abs=1e-6)  # same distributions


def test_t_squared_keeps_the_gradient_scale_for_large_t():
    torch.manual_seed(1)
    te = torch.randn(4, 8, 17)
    labels = torch.randint(0, 17, (4, 8))
    norms = {}
    for t in (10.0, 100.0):
        s = torch.randn(4, 8, 17, generator=torch.Generator().manual_seed(2)).requires_grad_(True)
        distillation_loss(s, te, labels, 0.0, t).backward()
        norms[t] = s.grad.norm().item()
    assert norms[100.0] / norms[10.0] == pytest.approx(1.0, rel=0.05)  # without T^2 it would be 1/100


def test_nothing_scored_is_zero_and_bad_settings_are_one_line():
    s = torch.randn(1, 2, 3, requires_grad=True)
    loss = distillation_loss(s, torch.randn(1, 2, 3), torch.full((1, 2), -100), 0.5, 2.0)
    assert loss.item() == 0.0
    loss.backward()
    for kw, text in [({"alpha": 1.5}, "alpha"), ({"temperature": 0.0}, "temperature")]:
        with pytest.raises(TformerError, match=text):
            distillation_loss(s, s, torch.zeros(1, 2, dtype=torch.long), **{"alpha": 0.5, "temperature": 2.0, **kw})
    with pytest.raises(TformerError, match="vocabulary"):
        distillation_loss(s, torch.randn(1, 2, 4), torch.zeros(1, 2, dtype=torch.long))


def _teacher(arch, n_layers=4, **kw):
    config = ModelConfig(arch=arch, n_layers=n_layers, d_model=32, n_heads=4, d_ff=64, vocab_size=40,
                         max_positions=32, decoder_start_token_id=0, pad_token_id=0, **kw)
    torch.manual_seed(0)
    return build(config)


def _layer_params(model, stack, index):
    prefix = f"{stack}.layers.{index}."
    return {k[len(prefix):]: v for k, v in model.state_dict().items() if k.startswith(prefix)}


@pytest.mark.parametrize("arch, stacks", [("decoder", ["decoder"]), ("encoder", ["encoder"]),
                                          ("encoder-decoder", ["encoder", "decoder"])])
def test_student_layers_are_the_chosen_teacher_layers(arch, stacks):
    teacher = _teacher(arch, n_layers=5, n_decoder_layers=4) if arch == "encoder-decoder" else _teacher(arch, 5)
    student = student_from_teacher(teacher)
    for stack in stacks:
        n = len(getattr(teacher, stack).order)
        picked = every_other(n)
        assert len(getattr(student, stack).order) == len(picked) == (n + 1) // 2
        for i, j in enumerate(picked):
            mine, theirs = _layer_params(student, stack, i), _layer_params(teacher, stack, j)
            assert mine.keys() == theirs.keys()
            assert all(torch.equal(mine[k], theirs[k]) for k in mine)
    others = {k: v for k, v in teacher.state_dict().items() if ".layers." not in k}
    assert others and all(torch.equal(student.state_dict()[k], v) for k, v in others.items())
    assert student.config.n_layers == 3  # 5 teacher layers: 0, 2, 4
    if arch == "encoder-decoder":
        assert student.config.n_decoder_layers == 2


def test_student_from_a_given_list_and_bad_lists():
    teacher = _teacher("decoder", tied_embeddings=True)
    student = student_from_teacher(teacher, keep=[3, 1])
    assert torch.equal(student.decoder.layers[0].mlp.up.weight, teacher.decoder.layers[3].mlp.up.weight)
    assert student.lm_head.weight is student.tok_embed.weight  # still tied in the student
    for bad in ([], [4], "every-third"):
        with pytest.raises(TformerError, match="keep="):
            student_from_teacher(teacher, keep=bad)
    with pytest.raises(TformerError, match="arch 'rnn'"):
        student_from_teacher(build(ModelConfig(arch="rnn", n_layers=2, d_model=16, vocab_size=20)))


def test_trainer_runs_the_distillation_loss_and_evaluates_plain_cross_entropy(tmp_path):
    teacher = _teacher("decoder")
    student = student_from_teacher(teacher)
    runner = DistillRunner(student, teacher, alpha=0.0, temperature=2.0)
    batch = FixedTokenSource(40, 8, 8).next_batch(4)
    student.train()
    with torch.no_grad():
        expected = distillation_loss(student(**batch.inputs).logits, teacher(**batch.inputs).logits, batch.targets,
                                     0.0, 2.0)
    assert runner.loss(batch).item() == pytest.approx(expected.item(), rel=1e-5)
    student.eval()
    with torch.no_grad():
        assert runner.loss(batch).item() == pytest.approx(F.cross_entropy(
            student(**batch.inputs).logits.reshape(-1, 40), batch.targets.reshape(-1)).item(), rel=1e-5)
    before = {k: v.clone() for k, v in teacher.state_dict().items()}
    args = TrainArgs(out=str(tmp_path / "run"), max_steps=2, batch_size=4, warmup=0, eval_interval=2,
                     ckpt_interval=2, eval_batches=1)
    result = Trainer(student, FixedTokenSource(40, 8, 8), args, log=lambda *_: None, runner=runner).run()
    assert result["step"] == 2 and math.isfinite(result["val_loss"])
    assert all(torch.equal(before[k], v) for k, v in teacher.state_dict().items())  # the teacher never moves
