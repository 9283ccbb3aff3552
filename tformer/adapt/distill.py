"""Knowledge distillation (Hinton, Vinyals & Dean 2015): a small student learns from a teacher's softened outputs.

``distillation_loss`` mixes the hard-label cross-entropy with the KL divergence from the teacher's distribution at
temperature T to the student's; ``student_from_teacher`` builds the student from every other teacher layer (as
DistilBERT, Sanh et al. 2019, was initialised); ``DistillRunner`` trains it in the project's training loop
(tformer.train.loop.Trainer's ``runner=``): the distillation loss while training, plain cross-entropy when evaluating.
"""

from __future__ import annotations

import contextlib
import re

import torch
import torch.nn.functional as F

from tformer.core.errors import TformerError
from tformer.model import build, runner_for
from tformer.model.base import IGNORE_INDEX
from tformer.model.blocks import Stack
from tformer.model.runner_base import Batch, Runner, Scored

STUDENT_ARCHS = ("decoder", "encoder", "encoder-decoder", "vit")  # the Stack-built models with per-stack layer counts


def distillation_loss(student_logits: torch.Tensor, teacher_logits: torch.Tensor, labels: torch.Tensor,
                      alpha: float = 0.5, temperature: float = 2.0) -> torch.Tensor:
    """alpha * CE(student, labels) + (1 - alpha) * T^2 * KL(softmax(teacher / T) || softmax(student / T)).

    student_logits, teacher_logits: (..., V); labels: (...) class ids, -100 = not scored (skipped by both terms).
    Each term is a mean over the scored positions (KL: summed over the V classes, "batchmean" over positions).
    The T^2 keeps the soft term's gradient about the same size whatever T (its gradient shrinks as 1 / T^2).
    """
    if not 0.0 <= alpha <= 1.0:
        raise TformerError(f"distillation alpha must be in [0, 1] (the weight of the hard labels), got {alpha}")
    if not temperature > 0:
        raise TformerError(f"distillation temperature must be positive (1 = the logits as they are), got {temperature}")
    if student_logits.shape != teacher_logits.shape:
        raise TformerError(f"student logits {tuple(student_logits.shape)} and teacher logits "
                           f"{tuple(teacher_logits.shape)} differ; the two models must share the vocabulary / classes")
    scored = labels != IGNORE_INDEX
    student, teacher = student_logits[scored].float(), teacher_logits[scored].float()  # (N, V)
    if student.shape[0] == 0:
        return student_logits.sum() * 0.0  # nothing scored: zero, still connected to the graph
    ce = F.cross_entropy(student, labels[scored])
    if alpha == 1.0:
        return ce
    kl = F.kl_div(F.log_softmax(student / temperature, -1), F.log_softmax(teacher / temperature, -1),
                  reduction="batchmean", log_target=True)
    return alpha * ce + (1.0 - alpha) * temperature**2 * kl


def every_other(n_layers: int) -> list[int]:
    """Teacher layers 0, 2, 4, ...: student layer i starts as teacher layer 2i."""
    return list(range(0, n_layers, 2))


def _stacks(model) -> dict[str, Stack]:
    return {name: m for name, m in model.named_modules() if isinstance(m, Stack)}


def _layer_field(config, stack: str) -> str:
    """The config field that counts a stack's layers (an encoder-decoder's decoder has its own)."""
    return "n_decoder_layers" if config.traits.seq2seq and stack == "decoder" else "n_layers"


def student_from_teacher(teacher, keep: str | list[int] | dict[str, list[int]] = "every-other"):
    """A new model with fewer layers, each a copy of a chosen teacher layer; embeddings, positions, norms and heads
    copied too. keep: "every-other" (teacher layers 0, 2, 4, ... in every stack), a list of teacher layer indices
    (every stack), or {stack name: list} (an encoder-decoder's "encoder" and "decoder"). The teacher is unchanged."""
    config = teacher.config
    if config.arch not in STUDENT_ARCHS:
        raise TformerError(f"a student from teacher layers needs a Transformer stack; arch '{config.arch}' has none "
                           f"(use one of: {', '.join(STUDENT_ARCHS)})")
    if config.share_layers:
        raise TformerError("this teacher shares one layer's weights across depths (ALBERT); a student of it is the "
                           "same weights run fewer times: set n_layers instead")
    stacks = {name: len(stack.order) for name, stack in _stacks(teacher).items()}
    chosen: dict[str, list[int]] = {}
    for name, n in stacks.items():
        pick = keep.get(name, every_other(n)) if isinstance(keep, dict) else keep
        pick = every_other(n) if pick == "every-other" else pick
        if isinstance(pick, str) or not pick or any(not isinstance(i, int) or not 0 <= i < n for i in pick):
            raise TformerError(f"keep={pick!r} for the {name} stack: give 'every-other' or a non-empty list of layer "
                               f"indices in 0..{n - 1}")
        chosen[name] = list(pick)
    changes = {_layer_field(config, name): len(pick) for name, pick in chosen.items()}
    first = next(teacher.parameters())
    student = build(config.replace(**changes), device=first.device, dtype=first.dtype, init=False)
    pattern = re.compile(r"^(.*)\.layers\.(\d+)\.(.*)$")
    source = teacher.state_dict()
    state = {}
    for key in student.state_dict():
        found = pattern.match(key)
        if found and found.group(1) in chosen:
            stack, index, rest = found.groups()
            key_in_teacher = f"{stack}.layers.{chosen[stack][int(index)]}.{rest}"
        else:
            key_in_teacher = key
        state[key] = source[key_in_teacher].clone()
    student.load_state_dict(state)
    return student.train(teacher.training)


class DistillRunner(Runner):
    """The student's runner with a distillation loss: ``loss`` while the student trains is distillation_loss against
    the teacher's logits on the same batch (the teacher frozen, in eval mode, no gradient); when evaluating (eval
    mode or no grad) it is the student's own cross-entropy, so validation losses compare with any other run's.
    label_smoothing is not applied to the distillation loss (the soft targets already smooth)."""

    def __init__(self, student, teacher, alpha: float = 0.5, temperature: float = 2.0):
        super().__init__(student)
        distillation_loss(torch.zeros(1, 1), torch.zeros(1, 1), torch.zeros(1, dtype=torch.long), alpha, temperature)
        self.student, self.teacher = runner_for(student), runner_for(teacher.eval().requires_grad_(False))
        self.alpha, self.temperature = alpha, temperature

    @property
    def loss_skips(self) -> tuple[str, ...]:
        return self.student.loss_skips

    @property
    def accuracy_metric(self) -> str:
        return self.student.accuracy_metric

    def forward(self, batch: Batch, module=None):
        return self.student.forward(batch, module)

    def _score(self, batch: Batch, module, label_smoothing, autocast, stand_in, chunk, count) -> Scored:
        self.check_chunk(chunk)
        if not (self.model.training and torch.is_grad_enabled()):
            return self.student._score(batch, module, label_smoothing, autocast, stand_in, chunk, count)
        teacher_model = self.teacher.model
        if next(teacher_model.parameters()).device != batch.targets.device:
            teacher_model.to(batch.targets.device)
        with autocast if autocast is not None else contextlib.nullcontext():
            student_logits = self.student.forward(batch, module).logits
            with torch.no_grad():
                teacher_logits = self.teacher.forward(batch).logits
        return Scored(distillation_loss(student_logits, teacher_logits, batch.targets, self.alpha, self.temperature))
