"""A tformer config JSON of the right syntax and the wrong content (issue 37): a value of another JSON type than
its field's (text for a whole number, a bool for a number, a fraction for a whole number, an object where a name
goes, a number past a float's range) is one line naming the key, and from a file naming the file too."""

from __future__ import annotations

import dataclasses
import json

import pytest
from hostile_values import HOSTILE, examples, one_line
from hypothesis import given
from hypothesis import strategies as st

from tformer.core.config import ModelConfig

TINY = dict(n_layers=1, d_model=8, n_heads=2, d_ff=16, vocab_size=16, max_positions=16)
FIELDS = {f.name: [k.strip() for k in str(f.type).split("|")] for f in dataclasses.fields(ModelConfig)}
TYPES = {"int": int, "float": float, "bool": bool, "str": str}


def of_type(value, kinds: list[str]) -> bool:
    """Whether a JSON value fits a field declared as ``kinds`` (a whole float fits an int; a bool fits only bool)."""
    if value is None:
        return "None" in kinds
    if isinstance(value, bool):
        return "bool" in kinds
    if isinstance(value, list):
        return "list[int]" in kinds and all(type(v) is int for v in value)
    if isinstance(value, float) and value.is_integer() and "int" in kinds:
        return True
    if isinstance(value, int) and "float" in kinds:
        return abs(value) < 1e308
    return any(type(value) is TYPES.get(k) for k in kinds) or (isinstance(value, int) and "int" in kinds)


def assert_typed(config: ModelConfig) -> None:
    for name, kinds in FIELDS.items():
        value = getattr(config, name)
        if value is None:
            assert "None" in kinds, name
        elif isinstance(value, list):
            assert "list[int]" in kinds and all(type(v) is int for v in value), (name, value)
        else:
            assert any(type(value) is TYPES.get(k) for k in kinds), (name, value)


@examples(300)
@given(st.lists(st.tuples(st.sampled_from(sorted(FIELDS)), HOSTILE), min_size=1, max_size=2))
def test_any_value_in_any_field_builds_a_typed_config_or_is_one_line_naming_a_wrong_key(changes):
    data = {**TINY, **dict(changes)}
    wrong = [k for k, v in changes if not of_type(data[k], FIELDS[k])]
    try:
        config = ModelConfig.from_dict(data)
    except Exception as exc:  # noqa: BLE001 - the property: a TformerError of one line, nothing else
        message = one_line(exc)
        if wrong:
            assert any(k in message for k in wrong), (wrong, message)
    else:
        assert not wrong, f"{wrong} read without a word"
        assert_typed(config)


@pytest.mark.parametrize("key, value, found", [
    ("n_layers", "4", '"4"'),
    ("n_layers", True, "true"),
    ("n_layers", 2.5, "2.5"),
    ("d_model", {"size": 8}, "an object of 1 key"),
    ("norm_eps", 10 ** 400, "digits"),
    ("bias", 1, "1"),
    ("position", ["rope"], "a list of 1 item"),
    ("cell", 3, "3"),
    ("name", None, "null"),
    ("arch", "x" * 5000, "5000 characters"),
], ids=lambda v: v if isinstance(v, str) and len(v) < 30 else "")
def test_a_wrong_type_in_a_file_names_the_file_the_key_and_what_it_holds(tmp_path, key, value, found):
    path = tmp_path / "config.json"
    path.write_text(json.dumps({**TINY, key: value}))
    with pytest.raises(Exception) as exc:
        ModelConfig.from_file(path)
    one_line(exc.value, str(path), key, found)


def test_whole_floats_are_whole_numbers_and_unknown_keys_are_named():
    assert ModelConfig.from_dict({**TINY, "n_layers": 2.0}).n_layers == 2
    with pytest.raises(Exception) as exc:
        ModelConfig.from_dict({**TINY, "n_layer": 2})
    one_line(exc.value, "unknown config key 'n_layer'", "did you mean 'n_layers'")
