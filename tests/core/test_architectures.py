"""One record per architecture (tformer.core.architectures): its traits and the names of its describer,
model class and runner. Here: every record's describer resolves to the function that describes its arch;
an unknown arch is one line; and the resolver refuses a name outside the layer that owns it, before importing
anything. (The model class and runner, and params == numel through them: tests/model/test_arch_records.py.)"""

from __future__ import annotations

import subprocess
import sys
from dataclasses import replace
from pathlib import Path

import pytest

from tformer.core.architectures import ARCH_RECORDS, ARCHS, ROLES, arch_record
from tformer.core.config import ModelConfig, preset
from tformer.core.errors import TformerError
from tformer.core.presets import PRESETS
from tformer.cost import architecture
from tformer.cost.architecture import describe, describer

COST = "tformer.cost.architecture"  # an asker in the cost layer
MODEL = "tformer.model.records"  # an asker in the model layer


def config_for(arch: str) -> ModelConfig:
    """The arch's first preset, else (rnn, rnn-seq2seq: no preset) its defaults."""
    name = next((n for n, spec in PRESETS.items() if spec.get("arch", "decoder") == arch), None)
    return preset(name) if name else ModelConfig(arch=arch)


def test_records_are_keyed_by_their_names():
    assert ARCHS == tuple(ARCH_RECORDS) and all(name == r.name for name, r in ARCH_RECORDS.items())
    assert ModelConfig(arch="rnn").traits is ARCH_RECORDS["rnn"]
    for record in ARCH_RECORDS.values():  # each named piece lies in the layer that resolves it
        for role, layer in ROLES.items():
            assert getattr(record, role).startswith(layer + "."), (record.name, role)


@pytest.mark.parametrize("arch", ARCHS)
def test_every_describer_resolves_and_describes_its_arch(arch):
    fn = describer(arch)
    module, _, name = ARCH_RECORDS[arch].describer.partition(":")
    assert callable(fn) and fn is getattr(sys.modules[module], name)
    config = config_for(arch)
    described = describe(config)
    assert described.arch == arch and described == fn(config)
    assert sum(_numel(s) for s in described.parameters().values()) > 0


def test_describers_are_distinct_and_cost_keeps_no_arch_chain():
    assert len({describer(a) for a in ARCHS}) == len(ARCHS)
    source = Path(architecture.__file__).read_text()
    assert "arch ==" not in source and "arch in (" not in source


def test_an_unknown_arch_is_one_line():
    with pytest.raises(TformerError) as e:
        arch_record("gpt9")
    assert "\n" not in str(e.value)
    assert str(e.value).startswith("arch='gpt9' is unknown; choose one of: decoder, encoder, encoder-decoder")
    config = ModelConfig()
    config.arch = "gpt9"  # past validation: describe still answers in one line
    with pytest.raises(TformerError, match=r"^arch='gpt9' is unknown"):
        describe(config)
    with pytest.raises(TformerError, match=r"^arch=None is unknown"):
        arch_record(None)
    with pytest.raises(TformerError, match="arch='gpt9' is unknown"):
        ModelConfig(arch="gpt9")


@pytest.mark.parametrize("role,ref", [
    ("describer", "tformer.model.decoder:DecoderLM"),  # cost asked to import the model layer
    ("describer", "torch.nn:Linear"),
    ("describer", "tformer.costly:describe"),  # a prefix of the layer's name is not the layer
    ("describer", "tformer.cost.architecture.describe_decoder"),  # not module:attribute
    ("model", "tformer.cost.architecture:describe_decoder"),
    ("runner", "tformer.train.loop:Trainer"),  # a layer above model
    ("runner", "tformer.model.runners"),
])
def test_the_resolver_refuses_a_name_outside_its_layer(role, ref):
    record = replace(ARCH_RECORDS["decoder"], **{role: ref})
    asker = COST if role == "describer" else MODEL
    with pytest.raises(TformerError, match=rf"its {role} '{ref}' must be 'module:attribute' with the module in "
                                           rf"{ROLES[role]}") as e:
        record.resolve(role, asker)
    assert "\n" not in str(e.value)


def test_the_resolver_refuses_an_asker_outside_the_layer_and_unknown_roles():
    record = ARCH_RECORDS["decoder"]
    with pytest.raises(TformerError, match=r"tformer.cost.architecture may not resolve an architecture's model: "
                                           r"only tformer.model does"):
        record.resolve("model", COST)
    with pytest.raises(TformerError, match="may not resolve an architecture's describer"):
        record.resolve("describer", "tformer.core.config")
    with pytest.raises(TformerError, match="names no 'tokenizer'; it names: describer, model, runner"):
        record.resolve("tokenizer", COST)


def test_the_resolver_names_what_is_missing_or_of_the_wrong_kind():
    record = ARCH_RECORDS["decoder"]
    with pytest.raises(TformerError, match="'tformer.cost.architecture:describe_gpt9', which "
                                           "tformer.cost.architecture does not define"):
        replace(record, describer=f"{COST}:describe_gpt9").resolve("describer", COST)
    with pytest.raises(TformerError, match="module 'tformer.cost.nowhere', which does not exist"):
        replace(record, describer="tformer.cost.nowhere:describe").resolve("describer", COST)
    with pytest.raises(TformerError, match="its describer 'tformer.cost.architecture:__all__' is not callable"):
        replace(record, describer=f"{COST}:__all__").resolve("describer", COST)
    with pytest.raises(TformerError, match="is not a subclass of TformerError"):
        record.resolve("describer", COST, TformerError)


def test_a_refused_name_is_never_imported():
    """The layer check comes before the import: a record cannot pull torch into cost (or anything into core)."""
    code = ("import sys\nfrom dataclasses import replace\nfrom tformer.core.architectures import ARCH_RECORDS\n"
            "from tformer.core.errors import TformerError\n"
            "bad = replace(ARCH_RECORDS['decoder'], describer='torch.nn:Linear')\n"
            "try:\n    bad.resolve('describer', 'tformer.cost.architecture')\nexcept TformerError:\n    pass\n"
            "else:\n    raise SystemExit('resolved')\n"
            "from tformer.cost.architecture import describe\nfrom tformer.core.config import ModelConfig\n"
            "for arch in ('decoder', 'rnn', 'clip'):\n    describe(ModelConfig(arch=arch))\n"
            "assert 'torch' not in sys.modules and 'tformer.model' not in sys.modules, sorted(sys.modules)\n")
    subprocess.run([sys.executable, "-c", code], check=True)


def _numel(shape):
    n = 1
    for x in shape:
        n *= x
    return n
