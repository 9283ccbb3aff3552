"""The model layer's side of an architecture's record (tformer.core.architectures): the model class
and the runner class the record names, resolved through the record's one resolver, which refuses a
name outside tformer.model. ``build`` and ``runner_for`` look them up here; nothing in model/ keeps a
table of its own from arch name to class."""

from __future__ import annotations

from tformer.core.architectures import arch_record
from tformer.model.base import TransformerModel
from tformer.model.runner_base import Runner


def model_class(arch: str) -> type[TransformerModel]:
    """The nn.Module class of arch ``arch``; an unknown arch is one line naming the known ones."""
    return arch_record(arch).resolve("model", __name__, TransformerModel)


def runner_class(arch: str) -> type[Runner]:
    """The Runner class of arch ``arch`` (a task head's runner is chosen by runner_for, before this)."""
    return arch_record(arch).resolve("runner", __name__, Runner)


__all__ = ["model_class", "runner_class"]
