"""POST /v1/completions and /v1/chat/completions over the ContinuousBatcher: one JSON answer, or server-sent
events token by token. Both run the same way; a chat request's prompt is its messages through the model's chat
template, its reply ends at the template's end-of-turn token, and its answer is shaped as OpenAI's chat
completion (``message`` / ``delta`` in place of ``text``).

The batcher calls ``on_event`` on its own thread; each event crosses to the event loop with
``loop.call_soon_threadsafe`` into an asyncio.Queue. A client that goes away (streaming or not) cancels
its sequence, so its rows leave the batch at the next step.
"""

from __future__ import annotations

import asyncio
import json
import time
import uuid

from fastapi import Request as HTTPRequest
from fastapi.responses import JSONResponse, Response, StreamingResponse

from tformer.core.errors import TformerError
from tformer.generate.continuous import ContinuousBatcher
from tformer.generate.workqueue import Closed, QueueFull
from tformer.serve.checks import ModelInfo, chat_engine_request, chat_prompt, completion_prompt, engine_request
from tformer.serve.errors import APIError
from tformer.serve.metrics import Metrics
from tformer.serve.schemas import ChatCompletionRequest, CompletionRequest, parse_body
from tformer.serve.textstream import IncrementalText

EARLY_ENDS = ("timeout", "cancelled", "error")  # finish reasons counted as errors in /metrics


def submit_or_refuse(submit):
    """``submit()``, with the batcher's refusals as HTTP answers: 429 (queue full) and 503 (shutting down)."""
    try:
        return submit()
    except QueueFull as exc:
        raise APIError(429, str(exc), code="queue_full", headers={"Retry-After": "1"}) from None
    except Closed as exc:
        raise APIError(503, str(exc), code="shutting_down", headers={"Retry-After": "5"}) from None
    except TformerError as exc:
        raise APIError(400, str(exc), code="invalid_value") from None


async def wait_disconnect(receive) -> None:
    """Returns when the client has gone (the ASGI server reports http.disconnect once the body is read)."""
    while (await receive())["type"] != "http.disconnect":
        pass


class Completions:
    """POST /v1/completions; ChatCompletions below changes what a request means and how the answer reads."""

    schema, kind, prefix = CompletionRequest, "text_completion", "cmpl"

    def __init__(self, batcher: ContinuousBatcher, info: ModelInfo, metrics: Metrics, request_timeout: float | None):
        self.batcher, self.info, self.metrics, self.timeout = batcher, info, metrics, request_timeout

    def prepare(self, req):
        """(prompt ids, the batcher's Request, the tokenizer the text is decoded with)."""
        prompt = completion_prompt(req, self.info)
        return prompt, engine_request(req, prompt, self.info, self.timeout), self.info.tokenizer

    def choice(self, text: str, tokens: list[int], finish: str) -> dict:
        return {"index": 0, "text": text, "token_ids": tokens, "finish_reason": finish}

    def delta(self, piece: str, ids: list[int], finish: str | None, first: bool) -> dict:
        return {"index": 0, "text": piece, "token_ids": ids, "finish_reason": finish}

    async def __call__(self, request: HTTPRequest) -> Response:
        req = parse_body(await request.body(), self.schema)
        prompt, engine_req, text_tokenizer = self.prepare(req)
        loop, events = asyncio.get_running_loop(), asyncio.Queue()

        def on_event(seq, token, finish):  # on the batcher's thread
            loop.call_soon_threadsafe(events.put_nowait, (token, finish))

        seq = submit_or_refuse(lambda: self.batcher.submit(engine_req, on_event))
        head = {"id": f"{self.prefix}-{uuid.uuid4().hex}", "object": self.kind, "created": int(time.time()),
                "model": self.info.name}
        pieces = self._pieces(seq, events, IncrementalText(text_tokenizer, req.stop_strings()))
        if req.stream:
            usage_chunk = bool(getattr(req, "stream_options", None) and req.stream_options.include_usage)
            return StreamingResponse(self._sse(seq, pieces, head, len(prompt), usage_chunk),
                                     media_type="text/event-stream", headers={"Cache-Control": "no-cache"})
        collect = asyncio.ensure_future(self._collect(pieces))
        gone = asyncio.ensure_future(wait_disconnect(request.receive))
        try:
            await asyncio.wait({collect, gone}, return_when=asyncio.FIRST_COMPLETED)
        finally:
            gone.cancel()
            if not collect.done():  # the client left (or the server is stopping): free its rows
                seq.cancel()
                collect.cancel()
        if not collect.done() or collect.cancelled():
            return Response(status_code=499)
        text, tokens, finish = collect.result()
        if finish == "error":
            raise APIError(500, f"generation failed: {seq.error}", code="generation_error")
        return JSONResponse({**head, "choices": [self.choice(text, tokens, finish)],
                             "usage": _usage(len(prompt), len(tokens))})

    async def _pieces(self, seq, events: asyncio.Queue, text: IncrementalText):
        """(new text, new token ids, finish reason or None) as the batcher reports; a stop string ends it."""
        started = time.monotonic()
        while True:
            token, finish = await events.get()
            if finish is not None:
                if finish in EARLY_ENDS:
                    self.metrics.errors.labels(finish).inc()
                yield text.finish(), [], finish
                return
            if not text.tokens:
                self.metrics.ttft.observe(time.monotonic() - started)
            self.metrics.tokens.inc()
            piece = text.push(token)
            if text.stopped:
                seq.cancel()  # the stop string is in the text: the rest would be cut anyway
                yield piece, [token], "stop"
                return
            yield piece, [token], None

    @staticmethod
    async def _collect(pieces):
        parts, tokens = [], []
        async for piece, ids, finish in pieces:
            parts.append(piece)
            tokens += ids
            if finish is not None:
                return "".join(parts), tokens, finish

    async def _sse(self, seq, pieces, head: dict, prompt_tokens: int, usage_chunk: bool = False):
        produced, first = 0, True
        try:
            async for piece, ids, finish in pieces:
                produced += len(ids)
                chunk = {**head, "choices": [self.delta(piece, ids, finish, first)]}
                first = False
                if finish is not None and not usage_chunk:
                    chunk["usage"] = _usage(prompt_tokens, produced)
                    if finish == "error":
                        chunk["error"] = {"message": f"generation failed: {seq.error}", "type": "server_error",
                                          "param": None, "code": "generation_error"}
                yield f"data: {json.dumps(chunk)}\n\n"
            if usage_chunk:  # OpenAI's stream_options.include_usage: a last chunk with no choices and the usage
                yield f"data: {json.dumps({**head, 'choices': [], 'usage': _usage(prompt_tokens, produced)})}\n\n"
            yield "data: [DONE]\n\n"
        finally:
            if not seq.done:  # the client went away mid-stream (the response task was cancelled)
                seq.cancel()


class ChatCompletions(Completions):
    """POST /v1/chat/completions: the messages through the model's chat template; the reply's text is the
    assistant message (special tokens left out), ending at the template's end-of-turn token."""

    schema, kind, prefix = ChatCompletionRequest, "chat.completion", "chatcmpl"

    def prepare(self, req):
        prompt, max_tokens = chat_prompt(req, self.info)
        return (prompt, chat_engine_request(req, prompt, max_tokens, self.info, self.timeout),
                _WithoutSpecials(self.info.tokenizer))

    def choice(self, text: str, tokens: list[int], finish: str) -> dict:
        ended = bool(tokens) and tokens[-1] in self.info.end_of_turn
        return {"index": 0, "message": {"role": "assistant", "content": text},
                "token_ids": tokens[:-1] if ended else tokens, "finish_reason": finish}

    def delta(self, piece: str, ids: list[int], finish: str | None, first: bool) -> dict:
        delta = {"role": "assistant", "content": piece} if first else ({"content": piece} if piece else {})
        return {"index": 0, "delta": delta, "finish_reason": finish}

    async def _sse(self, seq, pieces, head: dict, prompt_tokens: int, usage_chunk: bool = False):
        async for event in super()._sse(seq, pieces, {**head, "object": "chat.completion.chunk"}, prompt_tokens,
                                        usage_chunk):
            yield event


class _WithoutSpecials:
    """The tokenizer, decoding without special tokens: a chat reply's text never shows the end-of-turn token."""

    def __init__(self, tokenizer):
        self.tokenizer = tokenizer

    def decode(self, ids, skip_special: bool = True) -> str:
        return self.tokenizer.decode(ids, skip_special=True)


def _usage(prompt_tokens: int, completion_tokens: int) -> dict:
    return {"prompt_tokens": prompt_tokens, "completion_tokens": completion_tokens,
            "total_tokens": prompt_tokens + completion_tokens}


__all__ = ["ChatCompletions", "Completions", "submit_or_refuse", "wait_disconnect"]
