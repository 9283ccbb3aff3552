"""Requests checked against the model served: prompt lengths, the context window, the vocabulary, the endpoint.

A schema says what a field may hold in general; these say what fits this model, with the largest value
that would have been accepted in the message.
"""

from __future__ import annotations

from dataclasses import dataclass

from tformer.core.errors import TformerError
from tformer.generate.chat import chat_ids, stop_ids, template_for
from tformer.generate.continuous import Request
from tformer.generate.inputs import prompt_ids
from tformer.generate.sampling import Sampling
from tformer.serve.errors import APIError
from tformer.serve.schemas import ChatCompletionRequest, CompletionRequest, EmbeddingRequest

CHAT_MAX_TOKENS = 1024  # a chat reply's length when the request names none (it normally ends at end-of-turn first)


@dataclass(frozen=True)
class ModelInfo:
    """What the checks need to know of the model: sizes, kind and tokenizer."""

    name: str
    vocab_size: int
    max_positions: int
    eos_token_id: int | None
    generates: bool  # a decoder or encoder-decoder: /v1/completions
    takes_source: bool  # encoder-decoder: the prompt is the source, the answer starts from nothing
    tokenizer: object | None
    chat: object | None = None  # the chat template (a decoder with a tokenizer that has one, or ChatML tokens)
    chat_refusal: str = "this model does not chat"  # why /v1/chat/completions is refused when chat is None
    end_of_turn: tuple[int, ...] = ()  # the ids a chat reply ends at

    @classmethod
    def of(cls, model, tokenizer, name: str) -> ModelInfo:
        c, traits = model.config, model.config.traits
        chat, refusal, ends = None, f"{name} is {traits.label}; only a decoder chats", ()
        if traits.decoder and not traits.seq2seq:
            try:  # checked once at start-up: a template that does not compile is refused for every request alike
                chat = template_for(tokenizer)
                ends = tuple(stop_ids(tokenizer, c.eos_token_id))
            except TformerError as exc:
                chat, refusal = None, str(exc)
        return cls(name, c.vocab_size, c.max_positions, c.eos_token_id, bool(traits.decoder), bool(traits.seq2seq),
                   tokenizer, chat, refusal, ends)

    @property
    def kind(self) -> str:
        return "an encoder model" if not self.generates else "a generative model"


def _check_ids(ids: list[int], info: ModelInfo, param: str) -> None:
    bad = next((t for t in ids if not 0 <= t < info.vocab_size), None)
    if bad is not None:
        raise APIError(400, f"{param} holds token id {bad}, outside the vocabulary [0, {info.vocab_size})",
                       param=param, code="token_out_of_range")


def _encode(info: ModelInfo, text: str, param: str, special: bool = False) -> list[int]:
    if info.tokenizer is None:
        raise APIError(400, f"this model has no tokenizer, so {param} cannot be text; send token ids, e.g. [1, 2, 3]",
                       param=param, code="no_tokenizer")
    try:
        if special:
            try:
                return list(info.tokenizer.encode(text, add_special_tokens=True))
            except TypeError:  # a tformer tokenizer without special-token framing (char-level)
                pass
        return prompt_ids(info.tokenizer, text)
    except TformerError as exc:  # text the tokenizer cannot encode (a character outside its vocabulary)
        raise APIError(400, f"{param}: {exc}", param=param, code="cannot_encode") from None


def _fit(ids: list[int], info: ModelInfo, param: str) -> list[int]:
    if not ids:
        raise APIError(400, f"{param} is empty; give at least one token (text that encodes to no tokens counts as "
                       "empty)", param=param, code="empty_prompt")
    if len(ids) > info.max_positions:
        raise APIError(400, f"{param} is {len(ids)} tokens, beyond the context window of {info.max_positions}; "
                       "shorten it", param=param, code="prompt_too_long")
    _check_ids(ids, info, param)
    return ids


def completion_prompt(req: CompletionRequest, info: ModelInfo) -> list[int]:
    """The prompt as token ids, checked against the vocabulary and the context window."""
    if not info.generates:
        raise APIError(400, f"{info.name} is an encoder model: it does not generate; use /v1/embeddings",
                       param=None, code="wrong_endpoint")
    prompt = req.prompt[0] if isinstance(req.prompt, list) and req.prompt and not isinstance(req.prompt[0], int) \
        else req.prompt
    ids = _encode(info, prompt, "prompt") if isinstance(prompt, str) else list(prompt)
    ids = _fit(ids, info, "prompt")
    used = 1 if info.takes_source else len(ids)  # the decoder's start token, or the prompt itself
    room = info.max_positions - used
    if room < 1:
        raise APIError(400, f"prompt is {len(ids)} tokens and fills the context window of {info.max_positions}; "
                       "shorten it", param="prompt", code="prompt_too_long")
    if req.max_tokens > room:
        raise APIError(400, f"max_tokens is {req.max_tokens}, but with a prompt of {used} tokens the context window "
                       f"of {info.max_positions} leaves room for {room}; set max_tokens <= {room}",
                       param="max_tokens", code="beyond_context")
    if req.stop is not None and info.tokenizer is None:
        raise APIError(400, "this model has no tokenizer, so stop strings cannot be matched; use stop_token_ids",
                       param="stop", code="no_tokenizer")
    if req.stop_token_ids:
        _check_ids(req.stop_token_ids, info, "stop_token_ids")
    return ids


def chat_prompt(req: ChatCompletionRequest, info: ModelInfo) -> tuple[list[int], int]:
    """(the messages through the model's chat template as token ids, the reply's max tokens), checked."""
    if not info.generates:
        raise APIError(400, f"{info.name} is an encoder model: it does not generate; use /v1/embeddings",
                       param=None, code="wrong_endpoint")
    if info.chat is None or not info.end_of_turn:
        raise APIError(400, info.chat_refusal, param="messages", code="no_chat_template")
    try:
        ids = chat_ids(info.chat, info.tokenizer, req.messages)
    except TformerError as exc:  # a bad role or content, or a template that refuses these messages
        raise APIError(400, f"messages: {exc}", param="messages", code="invalid_messages") from None
    ids = _fit(ids, info, "messages")
    room = info.max_positions - len(ids)
    asked = req.max_completion_tokens or req.max_tokens
    param = "max_completion_tokens" if req.max_completion_tokens else "max_tokens"
    if room < 1:
        raise APIError(400, f"the messages take {len(ids)} tokens and fill the context window of "
                       f"{info.max_positions}; drop earlier messages", param="messages", code="prompt_too_long")
    if asked is not None and asked > room:
        raise APIError(400, f"{param} is {asked}, but the messages take {len(ids)} tokens of the context window of "
                       f"{info.max_positions}, leaving {room}; set {param} <= {room}", param=param,
                       code="beyond_context")
    return ids, asked or min(room, CHAT_MAX_TOKENS)


def chat_engine_request(req: ChatCompletionRequest, prompt: list[int], max_tokens: int, info: ModelInfo,
                        timeout: float | None) -> Request:
    """The batcher's Request for a chat reply: it ends at the template's end-of-turn token (or the model's EOS)."""
    return Request(prompt, max_new_tokens=max_tokens, sampling=_sampling(req), stop_tokens=info.end_of_turn,
                   seed=req.seed, timeout=timeout)


def engine_request(req: CompletionRequest, prompt: list[int], info: ModelInfo, timeout: float | None) -> Request:
    """The batcher's Request: the stop tokens given are added to the model's end-of-sequence token."""
    stop = None
    if req.stop_token_ids is not None or req.ignore_eos:
        eos = {info.eos_token_id} if info.eos_token_id is not None and not req.ignore_eos else set()
        stop = tuple(sorted(set(req.stop_token_ids or ()) | eos))
    return Request(prompt, max_new_tokens=req.max_tokens, sampling=_sampling(req), stop_tokens=stop, seed=req.seed,
                   timeout=timeout)


def _sampling(req) -> Sampling:
    """The request's token pick (its fields are checked by the schema: temperature 0 is greedy)."""
    return Sampling(temperature=req.temperature, top_k=req.top_k, top_p=req.top_p)


def embedding_rows(req: EmbeddingRequest, info: ModelInfo) -> list[list[int]]:
    """Each input as token ids (text framed with the tokenizer's special tokens, e.g. [CLS] ... [SEP])."""
    if info.generates:
        raise APIError(400, f"{info.name} is a generative model: /v1/embeddings serves encoder models only; use "
                       "/v1/completions", param=None, code="wrong_endpoint")
    raw = req.input
    if isinstance(raw, str) or (raw and isinstance(raw[0], int)) or not raw:
        raw = [raw]
    rows = [_encode(info, r, "input", special=True) if isinstance(r, str) else list(r) for r in raw]
    return [_fit(r, info, "input") for r in rows]


__all__ = ["ModelInfo", "chat_engine_request", "chat_prompt", "completion_prompt", "embedding_rows",
           "engine_request"]
