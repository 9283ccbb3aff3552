"""The request bodies, checked before anything reaches the model.

Types are strict: "5" is not a number and true is not a whole number; unknown fields are refused.
``parse_body`` reads the raw bytes itself (not FastAPI's body parsing) so every way a body can be
broken (not UTF-8, not JSON, nesting past Python's recursion limit, integers longer than the interpreter
parses) is one 400 answer naming the problem, and NaN/Infinity or a lone surrogate ("\\ud800") in a field
one 400 naming the field.
"""

from __future__ import annotations

import json
from typing import Annotated

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from tformer.core.errors import TformerError
from tformer.core.inputs import decode_text, first_bad_text
from tformer.serve.errors import APIError

MAX_STOP = 4
MAX_EMBED_INPUTS = 256
SEED_LIMIT = 2 ** 63

OneText = Annotated[list[str], Field(min_length=1, max_length=1)]
OneIds = Annotated[list[list[int]], Field(min_length=1, max_length=1)]
Texts = Annotated[list[str], Field(min_length=1, max_length=MAX_EMBED_INPUTS)]
IdLists = Annotated[list[list[int]], Field(min_length=1, max_length=MAX_EMBED_INPUTS)]

# What each field accepts, said in every 400 that names it.
FIELD_RULES = {
    "model": "a string (any name: this server serves one model)",
    "prompt": "a string, a list of token ids, or a list of one string or one list of token ids",
    "max_tokens": "a whole number >= 1 (prompt tokens + max_tokens must fit the context window)",
    "temperature": "a number in [0, 2] (0 = greedy)",
    "top_p": "a number in (0, 1]",
    "top_k": "a whole number >= 0 (0 = off)",
    "stop": f"a string or a list of at most {MAX_STOP} non-empty strings",
    "stop_token_ids": "a list of token ids in [0, vocab_size)",
    "seed": "a whole number in [0, 2**63)",
    "stream": "true or false",
    "n": "1 (one choice per request is supported)",
    "user": "a string",
    "input": f"a string, a list of at most {MAX_EMBED_INPUTS} strings, a list of token ids, or a list of lists of "
             "token ids",
    "encoding_format": "\"float\"",
    "messages": "a list of {\"role\": ..., \"content\": ...} objects (roles: system, user, assistant, tool)",
    "max_completion_tokens": "a whole number >= 1 (prompt tokens + max_completion_tokens must fit the context "
                             "window)",
    "stream_options": "{\"include_usage\": true or false}",
}


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True, allow_inf_nan=False)


class _Sampled(_Strict):
    """The fields completions and chat completions share: how to sample, when to stop, whether to stream."""

    model: str | None = None
    temperature: float = Field(1.0, ge=0.0, le=2.0)
    top_p: float = Field(1.0, gt=0.0, le=1.0)
    top_k: int = Field(0, ge=0)
    stop: str | Annotated[list[Annotated[str, Field(min_length=1)]], Field(max_length=MAX_STOP)] | None = None
    seed: int | None = Field(None, ge=0, lt=SEED_LIMIT)
    stream: bool = False
    n: int = Field(1, ge=1, le=1)
    user: str | None = None

    def stop_strings(self) -> list[str]:
        if self.stop is None:
            return []
        return [self.stop] if isinstance(self.stop, str) else list(self.stop)


class CompletionRequest(_Sampled):
    """POST /v1/completions: OpenAI's subset, plus top_k, stop_token_ids and ignore_eos (vLLM's and llama.cpp's:
    generate max_tokens whatever the model says, as load tests do)."""

    prompt: str | list[int] | OneText | OneIds
    max_tokens: int = Field(16, ge=1)
    stop_token_ids: list[int] | None = None
    ignore_eos: bool = False


class StreamOptions(_Strict):
    include_usage: bool = False


class ChatCompletionRequest(_Sampled):
    """POST /v1/chat/completions: OpenAI's subset (messages through the model's chat template), plus top_k.

    The messages' own shape (roles, content) is checked by tformer.data.chat_template.validate_messages, which
    says what is wrong in one line; here they only have to be a list."""

    messages: list
    max_tokens: int | None = Field(None, ge=1)
    max_completion_tokens: int | None = Field(None, ge=1)
    stream_options: StreamOptions | None = None


class EmbeddingRequest(_Strict):
    """POST /v1/embeddings: one input or a list of them, as text or token ids."""

    model: str | None = None
    input: str | list[int] | Texts | IdLists
    encoding_format: str = Field("float", pattern="^float$")
    user: str | None = None


class _NotANumber:
    """Where the body wrote NaN, Infinity or -Infinity: kept as a marker, so the 400 can name its field."""

    def __init__(self, spelled: str):
        self.spelled = spelled


def parse_body(raw: bytes, schema: type[BaseModel]):
    """``schema`` from the raw body, or an APIError(400) naming the field and what it accepts."""
    try:
        text = decode_text(raw, "the body", fix="send JSON encoded as UTF-8")
    except TformerError as exc:
        raise APIError(400, str(exc), code="invalid_utf8") from None
    try:
        data = json.loads(text, parse_constant=_NotANumber)
    except RecursionError:
        raise APIError(400, "the JSON nests too deeply; send a flat request object", code="invalid_json") from None
    except ValueError as exc:  # JSONDecodeError, an integer with too many digits
        raise APIError(400, f"the body is not valid JSON ({str(exc).splitlines()[0]}); send one JSON object",
                       code="invalid_json") from None
    if not isinstance(data, dict):
        raise APIError(400, f"the body is JSON {type(data).__name__}, not an object; send one JSON object",
                       code="invalid_json")
    for field, value in data.items():
        _check_field(field, value)
    try:
        return schema.model_validate(data)
    except ValidationError as exc:
        raise _validation_error(exc, schema) from None
    except RecursionError:
        raise APIError(400, "the JSON nests too deeply; send a flat request object", code="invalid_json") from None


def _check_field(field: str, value) -> None:
    """A field's text is Unicode and its numbers are numbers, before any schema or tokenizer sees them: JSON can
    spell a lone surrogate ("\\ud800"), which no tokenizer encodes and no answer can carry back, and Python's
    parser takes NaN and Infinity, which JSON has no place for."""
    bad = first_bad_text(field, escaped=False)
    if bad is not None:
        raise APIError(400, f"a field name is not valid UTF-8 ({bad}); send field names as UTF-8 text",
                       code="invalid_text")
    stack = [value]
    while stack:  # iterative: the body's nesting is bounded by the parser, not by this walk's recursion
        item = stack.pop()
        if isinstance(item, _NotANumber):
            raise APIError(400, f"{field} holds {item.spelled}, which is not a JSON number; expected "
                           f"{FIELD_RULES.get(field, 'a finite number')}", param=field, code="invalid_value")
        if isinstance(item, str):
            bad = first_bad_text(item, escaped=False)
            if bad is not None:
                raise APIError(400, f"{field} is not valid UTF-8 ({bad}); send it as UTF-8 text", param=field,
                               code="invalid_text")
        elif isinstance(item, list):
            stack.extend(item)
        elif isinstance(item, dict):
            stack.extend(item.keys())
            stack.extend(item.values())


def _validation_error(exc: ValidationError, schema: type[BaseModel]) -> APIError:
    first = exc.errors(include_url=False)[0]
    loc = first.get("loc") or ()
    param = str(loc[0]) if loc else None
    if first.get("type") == "extra_forbidden":
        known = ", ".join(schema.model_fields)
        return APIError(400, f"unknown field {param!r}; known fields: {known}",
                        param=param, code="unknown_field")
    if first.get("type") == "missing":
        return APIError(400, f"{param} is required: {FIELD_RULES.get(param, 'a value')}", param=param,
                        code="missing_field")
    rule = FIELD_RULES.get(param, "a valid value")
    return APIError(400, f"{param}: {first.get('msg', 'invalid value')}; expected {rule}", param=param,
                    code="invalid_value")


__all__ = ["FIELD_RULES", "MAX_EMBED_INPUTS", "MAX_STOP", "ChatCompletionRequest", "CompletionRequest",
           "EmbeddingRequest", "parse_body"]
