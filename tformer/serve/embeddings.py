"""POST /v1/embeddings for encoder models, batched dynamically.

Requests wait in a queue; a worker thread takes them when ``max_batch`` rows are waiting or
``window`` seconds after the first arrived, and runs them as one right-padded forward pass. Each
input's vector is the mean of last_hidden_state over its real tokens (padding excluded), L2-normalised
by default, as sentence-transformers' all-MiniLM-L6-v2 does (so a dot product is the cosine similarity).
"""

from __future__ import annotations

import asyncio
import time

import torch
import torch.nn.functional as F
from fastapi import Request as HTTPRequest
from fastapi.responses import JSONResponse

from tformer.generate.inputs import pad_batch
from tformer.generate.workqueue import Closed, WorkQueue
from tformer.serve.checks import ModelInfo, embedding_rows
from tformer.serve.completions import submit_or_refuse
from tformer.serve.errors import APIError
from tformer.serve.metrics import Metrics
from tformer.serve.schemas import EmbeddingRequest, parse_body


def mean_pool(hidden: torch.Tensor, mask: torch.Tensor, normalize: bool = True) -> torch.Tensor:
    """(B, T, d) states and a (B, T) mask of real tokens -> (B, d): the mean over each row's real tokens."""
    weights = mask.to(hidden.dtype).unsqueeze(-1)
    pooled = (hidden * weights).sum(1) / weights.sum(1).clamp(min=1)
    return F.normalize(pooled, dim=-1) if normalize else pooled


class EmbeddingBatcher(WorkQueue):
    """A worker thread that embeds queued requests in padded batches (flush when full or after the window)."""

    def __init__(self, model, *, max_batch: int = 32, max_queue: int = 256, window: float = 0.005,
                 normalize: bool = True):
        super().__init__(max_queue, "tformer-embedder")
        self.model, self.max_batch = model.eval(), max_batch
        self.window, self.normalize = window, normalize
        pad = model.config.pad_token_id
        self._pad = pad if pad is not None else 0
        self._device = next(model.parameters()).device
        self._busy = 0  # rows in the batch being embedded

    @property
    def active(self) -> int:
        return self._busy

    def submit(self, rows: list[list[int]], done) -> None:
        """Queue ``rows``; ``done(list of vectors)`` or ``done(exception)`` is called on the worker thread."""
        self._enqueue((rows, done))

    def _take(self) -> list:
        """Wait for work, then for the batch to fill or the window to pass; None when closing with nothing left
        (or with what is left refused: shutdown without drain)."""
        with self._cond:
            while not (self._pending or self._closing):
                self._cond.wait()
            if self._closing and not self._drain:
                for _, done in self._pending:
                    done(Closed("the server stopped before this request ran"))
                self._pending.clear()
            if not self._pending:
                return None
            deadline = time.monotonic() + self.window
            while not self._closing and sum(len(r) for r, _ in self._pending) < self.max_batch:
                left = deadline - time.monotonic()
                if left <= 0:
                    break
                self._cond.wait(left)
            batch, rows = [], 0
            while self._pending and (not batch or rows + len(self._pending[0][0]) <= self.max_batch):
                item = self._pending.popleft()
                batch.append(item)
                rows += len(item[0])
            self._busy = rows
            return batch

    def _loop(self) -> None:
        while (batch := self._take()) is not None:
            try:
                vectors = self._embed([row for rows, _ in batch for row in rows])
                at = 0
                for rows, done in batch:
                    done(vectors[at:at + len(rows)])
                    at += len(rows)
            except Exception as exc:  # one bad batch must not stop the worker: its requests get the error
                for _, done in batch:
                    done(exc)
            finally:
                self._busy = 0

    @torch.no_grad()
    def _embed(self, rows: list[list[int]]) -> list[list[float]]:
        ids, mask = pad_batch(rows, self._pad, "right", self._device)
        hidden = self.model(ids, attention_mask=mask).last_hidden_state
        return mean_pool(hidden.float(), mask, self.normalize).tolist()


class Embeddings:
    def __init__(self, batcher: EmbeddingBatcher, info: ModelInfo, metrics: Metrics):
        self.batcher, self.info, self.metrics = batcher, info, metrics

    async def __call__(self, request: HTTPRequest) -> JSONResponse:
        req = parse_body(await request.body(), EmbeddingRequest)
        rows = embedding_rows(req, self.info)
        loop = asyncio.get_running_loop()
        result = loop.create_future()

        def done(value):  # on the worker thread
            loop.call_soon_threadsafe(lambda: result.done() or result.set_result(value))

        submit_or_refuse(lambda: self.batcher.submit(rows, done))
        value = await result
        if isinstance(value, Exception):
            if isinstance(value, Closed):
                raise APIError(503, str(value), code="shutting_down")
            raise APIError(500, f"embedding failed: {type(value).__name__}: {value}", code="embedding_error")
        self.metrics.embedded.inc(len(rows))
        tokens = sum(len(r) for r in rows)
        return JSONResponse({"object": "list", "model": self.info.name,
                             "data": [{"object": "embedding", "index": i, "embedding": v} for i, v in enumerate(value)],
                             "usage": {"prompt_tokens": tokens, "total_tokens": tokens}})


__all__ = ["EmbeddingBatcher", "Embeddings", "mean_pool"]
