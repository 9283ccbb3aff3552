"""Inputs at the edges against a live server (issue 37): a body that is not UTF-8, a string field holding a lone
surrogate, NaN/Infinity/1e400 and the other float64 edges as sampling values. Each refusal is a 400 in
OpenAI's shape naming the field (param None when the fault is the body as a whole), and the request after it
is answered 200. The body parser is fuzzed too (hypothesis): any bytes, and JSON objects whose fields are
drawn from float64's edges and from text with lone surrogates, give a request whose numbers are finite and
whose text is UTF-8, or one 400."""

from __future__ import annotations

import json
import math

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from test_hostile import JSON, assert_alive, assert_error

from tformer.serve.errors import APIError
from tformer.serve.schemas import CompletionRequest, EmbeddingRequest, parse_body

# (name, raw body, param at fault)
EDGE_BODIES = [
    ("body-latin1", b'{"prompt": "caf\xe9"}', None),
    ("body-cut-sequence", b'{"prompt": "to be \xe2\x82"}', None),
    ("body-overlong-slash", b'{"prompt": "\xc0\xaf"}', None),
    ("body-lone-surrogate-bytes", b'{"prompt": "\xed\xa0\x80"}', None),  # CESU: not UTF-8
    ("prompt-lone-surrogate", b'{"prompt": "to \\ud800 be", "max_tokens": 2}', "prompt"),
    ("prompt-list-lone-surrogate", b'{"prompt": ["\\udcff"], "max_tokens": 2}', "prompt"),
    ("stop-lone-surrogate", b'{"prompt": [1, 2], "stop": ["\\udfff"]}', "stop"),
    ("user-lone-surrogate", b'{"prompt": [1, 2], "user": "\\ud83d"}', "user"),
    ("model-lone-surrogate", b'{"prompt": [1, 2], "model": "m\\udc00"}', "model"),
    ("temperature-nan", b'{"prompt": [1, 2], "temperature": NaN}', "temperature"),
    ("temperature-minus-infinity", b'{"prompt": [1, 2], "temperature": -Infinity}', "temperature"),
    ("temperature-1e400", b'{"prompt": [1, 2], "temperature": 1e400}', "temperature"),
    ("temperature-1e308", b'{"prompt": [1, 2], "temperature": 1e308}', "temperature"),
    ("top-p-nan", b'{"prompt": [1, 2], "top_p": NaN}', "top_p"),
    ("top-p-infinity", b'{"prompt": [1, 2], "top_p": Infinity}', "top_p"),
    ("top-p-negative-zero", b'{"prompt": [1, 2], "top_p": -0.0}', "top_p"),
    ("top-k-huge", b'{"prompt": [1, 2], "top_k": 1e400}', "top_k"),
    ("seed-huge", b'{"prompt": [1, 2], "seed": ' + str(10 ** 400).encode() + b"}", "seed"),
    ("max-tokens-infinity", b'{"prompt": [1, 2], "max_tokens": Infinity}', "max_tokens"),
]


@pytest.mark.parametrize("raw,param", [c[1:] for c in EDGE_BODIES], ids=[c[0] for c in EDGE_BODIES])
def test_edge_body_is_a_400_naming_the_field(dec, raw, param):
    err = assert_error(dec.client.post("/v1/completions", content=raw, headers=JSON), 400, param)
    if param is None:
        assert "the body is not valid UTF-8 (byte 0x" in err["message"] and err["code"] == "invalid_utf8"
    assert_alive(dec)


@pytest.mark.parametrize("value", ["1e-320", "5e-324", "-0.0", "0.0"])
def test_subnormal_and_negative_zero_temperatures_are_answered(dec, value):
    r = dec.client.post("/v1/completions", content=b'{"prompt": [1, 2], "max_tokens": 2, "temperature": '
                        + value.encode() + b', "top_p": 1e-320}', headers=JSON)
    assert r.status_code == 200, r.text
    assert r.json()["choices"][0]["token_ids"]


def test_a_lone_surrogate_in_an_embedding_input(enc):
    err = assert_error(enc.client.post("/v1/embeddings", content=b'{"input": ["ok", "\\ud800"]}', headers=JSON),
                       400, "input")
    assert "lone surrogate U+D800 at byte 0" in err["message"]
    r = enc.client.post("/v1/embeddings", json={"input": [1, 2, 3]})
    assert r.status_code == 200, r.text


# The parser alone, fuzzed -------------------------------------------------------------------------------
EDGE_NUMBERS = st.one_of(st.sampled_from([math.inf, -math.inf, math.nan, 1e308, 1e-320, -0.0, 10 ** 400, 2 ** 63]),
                         st.floats(), st.integers())
EDGE_TEXT = st.text(st.one_of(st.characters(max_codepoint=0x2FF), st.characters(min_codepoint=0xD800,
                                                                                 max_codepoint=0xDFFF)), max_size=6)
PROMPT = st.one_of(EDGE_TEXT, st.lists(st.integers(0, 40), min_size=1, max_size=3))
FIELDS = {"temperature": EDGE_NUMBERS, "top_p": EDGE_NUMBERS, "top_k": EDGE_NUMBERS, "max_tokens": EDGE_NUMBERS,
          "seed": EDGE_NUMBERS, "stop": st.one_of(EDGE_TEXT, st.lists(EDGE_TEXT, max_size=2)), "user": EDGE_TEXT}


def _parsed_or_400(raw: bytes, schema, fields: dict | None):
    try:
        req = parse_body(raw, schema)
    except APIError as exc:
        assert exc.status == 400 and exc.message and "\n" not in exc.message
        assert fields is None or exc.param is None or exc.param in fields, (exc.param, fields)
        exc.encoded()  # the answer itself encodes
        return None
    for value in req.model_dump().values():
        for item in value if isinstance(value, list) else [value]:
            if isinstance(item, float):
                assert math.isfinite(item)
            if isinstance(item, str):
                item.encode("utf-8")
    return req


@settings(max_examples=150, deadline=None, derandomize=True)
@given(fields=st.fixed_dictionaries({"prompt": PROMPT}, optional=FIELDS))
def test_any_fields_parse_to_finite_utf8_or_one_400(fields):
    raw = json.dumps(fields).encode()  # Python writes NaN/Infinity and escapes surrogates as \\udXXX
    _parsed_or_400(raw, CompletionRequest, fields)


@settings(max_examples=150, deadline=None, derandomize=True)
@given(raw=st.one_of(st.binary(max_size=40), EDGE_TEXT.map(lambda t: json.dumps({"input": t}).encode()),
                     st.binary(max_size=8).map(lambda b: b'{"input": "' + b + b'"}')))
def test_any_bytes_parse_or_one_400(raw):
    _parsed_or_400(raw, EmbeddingRequest, None)
