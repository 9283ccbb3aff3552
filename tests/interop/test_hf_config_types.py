"""A Hugging Face config.json of the right syntax and the wrong content (issue 37): every key a reader reads is
type-checked before any reader runs, so a string, a bool, a fraction, a null, a list or an object where a number
goes is one line naming the key (and, through load_config, the file), never a TypeError from arithmetic nor a
model built from "8888" (4 * "8")."""

from __future__ import annotations

import dataclasses
import json
import warnings

import pytest
from hostile_values import DELETE, HOSTILE, examples, one_line
from hypothesis import given
from hypothesis import strategies as st

from tformer.core.config import ModelConfig, preset
from tformer.interop import load_config
from tformer.interop.hf_config import config_from_hf, config_to_hf
from tformer.interop.hf_fields import HF_KEY_KINDS, ROPE_KEY_KINDS

# One valid config.json per family tformer reads, written from a preset of that family.
FAMILIES = {"gpt2": "char-small", "bert": "bert-base", "roberta": "roberta-base", "distilbert": "distilbert-base",
            "albert": "albert-base", "t5": "t5-small", "bart": "bart-base", "llama": "llama-7b",
            "mistral": "mistral-7b", "vit": "vit-tiny-16", "clip": "clip-vit-b-32"}
with warnings.catch_warnings():
    warnings.simplefilter("ignore")  # dropout rates HF cannot hold: irrelevant to reading
    BASES = {family: config_to_hf(preset(name)) for family, name in FAMILIES.items()}
KEYS = sorted(set(HF_KEY_KINDS) | {k for base in BASES.values() for k in base})
TYPES = {"int": int, "float": float, "bool": bool, "str": str}


def assert_typed(config: ModelConfig) -> None:
    """Every field holds a value of its declared type (bool is not an int here, nor an int a float)."""
    for f in dataclasses.fields(ModelConfig):
        value = getattr(config, f.name)
        kinds = [k.strip() for k in str(f.type).split("|")]
        if value is None:
            assert "None" in kinds, f.name
        elif isinstance(value, list):
            assert "list[int]" in kinds and all(type(v) is int for v in value), (f.name, value)
        else:
            assert any(type(value) is TYPES.get(k) for k in kinds), (f.name, value, f.type)


NUMERIC = {"count", "whole", "number", "positive"}


def misfit(d: dict, prefix: str = "") -> str | None:
    """The first key holding text, a list or an object where a number goes, or a non-bool where a bool goes:
    what must be refused by name (a spec of its own, simpler than the reader's)."""
    for key, kind in HF_KEY_KINDS.items():
        value = d.get(key)
        if kind in NUMERIC and isinstance(value, (str, list, dict)) or kind == "bool" and value is not None \
                and not isinstance(value, bool):
            return prefix + key
    return None


def read(d: dict, must_name: str | None = None) -> None:
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            config = config_from_hf(d)
    except Exception as exc:  # noqa: BLE001 - the property: a TformerError of one line, nothing else
        one_line(exc)
    else:
        assert must_name is None, f"{must_name} = {d.get(must_name)!r} was read without a word"
        assert_typed(config)


@examples(400)
@given(st.sampled_from(sorted(BASES)),
       st.lists(st.tuples(st.sampled_from(KEYS), st.one_of(HOSTILE, st.just(DELETE))), min_size=1, max_size=3))
def test_any_value_in_any_key_reads_or_is_one_line(family, changes):
    d = json.loads(json.dumps(BASES[family]))
    for key, value in changes:
        if value is DELETE:
            d.pop(key, None)
        else:
            d[key] = value
    read(d, misfit(d) if isinstance(d.get("model_type"), str) and d["model_type"] in BASES else None)


@examples(150)
@given(st.sampled_from(["llama", "mistral"]), st.sampled_from(["rope_scaling", "rope_parameters"]),
       st.dictionaries(st.sampled_from(sorted(ROPE_KEY_KINDS)), HOSTILE, max_size=4),
       st.sampled_from(["linear", "dynamic", "yarn", "default", "llama3"]))
def test_rope_settings_of_any_type_read_or_are_one_line(family, key, spec, rope_type):
    read({**BASES[family], key: {"rope_type": rope_type, **spec}})


@examples(150)
@given(st.sampled_from(["text_config", "vision_config"]), st.sampled_from(KEYS), HOSTILE)
def test_clip_tower_keys_of_any_type_read_or_are_one_line(tower, key, value):
    d = json.loads(json.dumps(BASES["clip"]))
    d[tower] = {**d.get(tower, {}), key: value}
    read(d, misfit(d[tower], f"{tower}."))


@pytest.mark.parametrize("key, value, found", [
    ("n_embd", "8", '"8"'),
    ("n_embd", {"size": 8}, "an object of 1 key"),
    ("n_layer", True, "true"),
    ("n_layer", 2.5, "2.5"),
    ("n_head", None, "null"),
    ("tie_word_embeddings", None, "null"),  # transformers reads null as false; tformer read it as tied
    ("layer_norm_epsilon", 10 ** 400, "digits"),
    ("activation_function", ["gelu"], "a list of 1 item"),
    ("architectures", "GPT2LMHeadModel", '"GPT2LMHeadModel"'),
    ("pad_token_id", "0", '"0"'),
    ("resid_pdrop", float("nan"), "NaN"),
], ids=lambda v: v if isinstance(v, str) and len(v) < 30 else "")
def test_a_wrong_type_names_the_file_the_key_and_what_it_holds(tmp_path, key, value, found):
    path = tmp_path / "config.json"
    path.write_text(json.dumps({"model_type": "gpt2", "n_layer": 2, "n_embd": 8, "n_head": 2, "vocab_size": 16,
                                "n_positions": 16, key: value}))
    with pytest.raises(Exception) as exc:
        load_config(path)
    one_line(exc.value, str(path), f"'{key}'", found)


def test_integral_floats_read_as_whole_numbers_and_nested_keys_are_named(tmp_path):
    d = {**BASES["gpt2"], "n_layer": 2.0}
    assert config_from_hf(d).n_layers == 2
    with pytest.raises(Exception) as exc:
        config_from_hf({**BASES["clip"], "vision_config": {"patch_size": [16, "16"]}})
    one_line(exc.value, "'vision_config.patch_size'")
    with pytest.raises(Exception) as exc:
        config_from_hf({**BASES["llama"], "rope_scaling": {"rope_type": "linear", "factor": -2}})
    one_line(exc.value, "'rope_scaling.factor'", "positive")
    with pytest.raises(Exception) as exc:
        config_from_hf({**BASES["gpt2"], "model_type": ["gpt2"]})
    one_line(exc.value, "model_type")


def test_a_config_that_is_not_utf8_names_the_byte(tmp_path):
    path = tmp_path / "config.json"
    data = b'{"model_type": "gpt2", "_name_or_path": "caf\xe9"}'
    path.write_bytes(data)
    with pytest.raises(Exception) as exc:
        load_config(path)
    one_line(exc.value, str(path), "not UTF-8", f"byte {data.index(0xE9)}")
