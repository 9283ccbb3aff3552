"""Perplexity with llama.cpp's protocol (``llama-perplexity -c N``), so the figure compares with its figure on
the same model and text.

The whole text is tokenized once (a BOS in front when the tokenizer adds one). It is cut into consecutive
chunks of ``ctx`` tokens (a partial last chunk is dropped). Each chunk is one forward pass from an empty cache;
with a BOS-adding tokenizer the chunk's first token is replaced by BOS. Only the second half of each chunk is
scored: the logits at positions ctx/2 .. ctx-2 predict tokens ctx/2+1 .. ctx-1, each having seen at least ctx/2
tokens of context. Perplexity = exp(mean negative log-likelihood over every scored token).
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable
from dataclasses import dataclass

import torch

from tformer.core.errors import TformerError
from tformer.model.path_choice import choose_paths


@dataclass
class PerplexityResult:
    perplexity: float
    nll: float  # mean negative log-likelihood per scored token (nats)
    chunks: int
    ctx: int
    scored_tokens: int
    text_tokens: int
    seconds: float
    chunk_ppl: list[float]  # the running perplexity after each chunk, as llama-perplexity prints it

    @property
    def tokens_per_s(self) -> float:
        return self.chunks * self.ctx / self.seconds if self.seconds > 0 else 0.0


def chunk_ids(ids: list[int], ctx: int, bos_id: int | None, max_chunks: int | None = None) -> torch.Tensor:
    """(n_chunks, ctx) consecutive chunks, the first token of each replaced by BOS when one is given."""
    if ctx < 4 or ctx % 2:
        raise TformerError(f"--ctx must be an even number of tokens >= 4, got {ctx}")
    n = len(ids) // ctx
    if max_chunks is not None:
        n = min(n, max_chunks)
    if n < 1:
        raise TformerError(f"the text has {len(ids)} tokens, fewer than one chunk of {ctx}; give a longer text "
                           "or a smaller --ctx")
    chunks = torch.tensor(ids[: n * ctx], dtype=torch.long).view(n, ctx)
    if bos_id is not None:
        chunks[:, 0] = bos_id
    return chunks


@torch.no_grad()
def perplexity(model, ids: list[int], ctx: int = 512, bos_id: int | None = None, batch: int = 1,
               max_chunks: int | None = None, progress: Callable[[int, int, float], None] | None = None,
               ) -> PerplexityResult:
    """llama.cpp's perplexity of ``model`` over the token ids of a text (see the module docstring).

    ``batch`` chunks go through the model together (each is its own sequence: no context crosses chunks).
    ``progress(done, total, running_ppl)`` is called after each batch."""
    if ctx > model.config.max_positions:
        raise TformerError(f"--ctx {ctx} exceeds the model's context of {model.config.max_positions} tokens")
    chunks = chunk_ids(ids, ctx, bos_id, max_chunks)
    first = ctx // 2
    model.eval()
    choose_paths(model)  # each Linear's path for these products, before the first
    device = next(model.parameters()).device
    total_nll, scored, running = 0.0, 0, []
    start = time.perf_counter()
    for lo in range(0, len(chunks), batch):
        x = chunks[lo: lo + batch].to(device)
        logits = model(x).logits[:, first: ctx - 1].float()  # (b, ctx/2 - 1, vocab): predicts x[:, first+1:]
        targets = x[:, first + 1:]
        nll = torch.nn.functional.cross_entropy(logits.reshape(-1, logits.shape[-1]), targets.reshape(-1),
                                                reduction="none").view(len(x), -1).double()
        for row in nll:  # llama-perplexity's running figure after each chunk
            total_nll += row.sum().item()
            scored += row.numel()
            running.append(math.exp(total_nll / scored))
        if progress is not None:
            progress(min(lo + batch, len(chunks)), len(chunks), running[-1])
    seconds = time.perf_counter() - start
    mean = total_nll / scored
    return PerplexityResult(perplexity=math.exp(mean), nll=mean, chunks=len(chunks), ctx=ctx, scored_tokens=scored,
                            text_tokens=len(ids), seconds=seconds, chunk_ppl=running)


__all__ = ["PerplexityResult", "chunk_ids", "perplexity"]
