"""Each architecture's record (tformer.core.architectures) names its model class and runner; build and
runner_for look them up there. For every record: the names resolve to a TransformerModel and a Runner, the
model built for the arch's preset is that class, its runner that runner, and the description its describer
gives has the model's parameter count."""

from __future__ import annotations

from dataclasses import replace

import pytest

from tformer.core.architectures import ARCH_RECORDS, ARCHS
from tformer.core.config import ModelConfig, preset
from tformer.core.errors import TformerError
from tformer.core.presets import PRESETS
from tformer.cost.architecture import describer
from tformer.model import TransformerModel, build, model_class, runner_class, runner_for
from tformer.model.runner_base import Runner


def config_for(arch: str) -> ModelConfig:
    """The arch's first preset, else (rnn, rnn-seq2seq: no preset) its defaults."""
    name = next((n for n, spec in PRESETS.items() if spec.get("arch", "decoder") == arch), None)
    return preset(name) if name else ModelConfig(arch=arch)


@pytest.mark.parametrize("arch", ARCHS)
def test_every_record_resolves_to_its_model_runner_and_describer(arch):
    model_cls, runner_cls = model_class(arch), runner_class(arch)
    assert issubclass(model_cls, TransformerModel) and issubclass(runner_cls, Runner)
    assert model_cls.__module__ + ":" + model_cls.__name__ == ARCH_RECORDS[arch].model
    config = config_for(arch)
    model = build(config, device="meta")
    assert type(model) is model_cls and type(runner_for(model)) is runner_cls
    described = describer(arch)(config).parameters()
    assert sum(_numel(s) for s in described.values()) == sum(p.numel() for p in model.parameters())


def test_records_name_distinct_models():
    assert len({model_class(a) for a in ARCHS}) == len(ARCHS)


def test_an_unknown_arch_is_one_line_from_the_model_layer():
    for lookup in (model_class, runner_class):
        with pytest.raises(TformerError, match=r"^arch='gpt9' is unknown; choose one of: decoder, ") as e:
            lookup("gpt9")
        assert "\n" not in str(e.value)


def test_the_model_layer_refuses_a_runner_that_is_not_one():
    bad = replace(ARCH_RECORDS["decoder"], runner="tformer.model.decoder:DecoderLM")
    with pytest.raises(TformerError, match="runner 'tformer.model.decoder:DecoderLM' is not a subclass of Runner"):
        bad.resolve("runner", "tformer.model.records", Runner)


def _numel(shape):
    n = 1
    for x in shape:
        n *= x
    return n
