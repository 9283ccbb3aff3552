"""Generation's inputs, checked and shaped before the first step: prompts in any accepted form as rows of ids,
padding, stop tokens, the context window (a prompt cut to fit, a seq2seq source and its decoder's start) and the
memory a request needs. generate (tformer.generate.search) and the serving batcher read them; no step runs here."""

from __future__ import annotations

import torch

from tformer.core import fmt
from tformer.core.errors import TformerError
from tformer.cost.memory import generation_bytes
from tformer.machine import available_memory_bytes

# Sequences decoded at once (batch x beams). Beyond this a request is a typo, not a workload: a
# 1-layer model with a 16-token vocabulary already takes minutes and gigabytes for a million beams.
MAX_ROWS = 65536



def prompt_rows(input_ids, attention_mask) -> list[list[int]]:
    """Any accepted prompt form -> one list of real token ids per row."""
    if isinstance(input_ids, torch.Tensor):
        if input_ids.dim() == 1:
            input_ids = input_ids[None]
        if input_ids.dim() != 2:
            raise TformerError(f"input_ids must be (batch, length), got shape {tuple(input_ids.shape)}")
        ids = input_ids.tolist()
        if attention_mask is None:
            return ids
        mask = attention_mask.tolist()
        return [[t for t, m in zip(r, mr) if m] for r, mr in zip(ids, mask)]
    if isinstance(input_ids, (list, tuple)):
        if len(input_ids) == 0:
            raise TformerError("no prompt given; pass at least one token id")
        if all(isinstance(t, int) for t in input_ids):
            return [list(input_ids)]
        return [list(r) for r in input_ids]
    raise TformerError(f"input_ids must be a tensor or a list of token ids, got {type(input_ids).__name__}")


def filler_id(vocab_size: int, *candidates) -> int:
    """The id that fills padding and finished rows: the first candidate (int or None) inside the vocabulary, else 0.
    Padding is masked, but the embedding still looks the id up: a config that keeps another model's pad or end id
    (a GPT-2 config cut to a small vocabulary keeps 50256) would fail at the first padded batch."""
    for c in candidates:
        if isinstance(c, int) and not isinstance(c, bool) and 0 <= c < vocab_size:
            return c
    return 0


def prompt_ids(tokenizer, text: str) -> list[int]:
    """The ids a text prompt starts generation from: its tokens, after BOS where the tokenizer says its model
    expects one (a GGUF file's add_bos: Gemma's does, SmolLM2's does not), as llama.cpp prompts. Without it a
    model trained with BOS first reads the prompt as the middle of a document (Gemma 3 repeats itself)."""
    ids = list(tokenizer.encode(text))
    bos = getattr(tokenizer, "bos_id", None)
    if getattr(tokenizer, "add_bos", False) and bos is not None and ids[:1] != [bos]:
        ids.insert(0, bos)
    return ids


def pad_batch(rows: list[list[int]], pad: int, side: str, device=None) -> tuple[torch.Tensor, torch.Tensor]:
    """Rows of different lengths -> (ids, mask), padded on the ``side`` ("left" or "right")."""
    width = max(len(r) for r in rows)
    ids = torch.full((len(rows), width), pad, dtype=torch.long)
    mask = torch.zeros((len(rows), width), dtype=torch.long)
    for i, r in enumerate(rows):
        sl = slice(width - len(r), width) if side == "left" else slice(0, len(r))
        ids[i, sl] = torch.tensor(r, dtype=torch.long)
        mask[i, sl] = 1
    return ids.to(device), mask.to(device)


def stop_matrix(stop_tokens, batch: int, vocab: int, device) -> torch.Tensor:
    """(B, V) bool: True where token v ends row b. Accepts an id, a list, or one list per row."""
    if stop_tokens is None:
        stop_tokens = []
    if isinstance(stop_tokens, int):
        stop_tokens = [stop_tokens]
    per_row = len(stop_tokens) > 0 and all(isinstance(s, (list, tuple)) for s in stop_tokens)
    if per_row and len(stop_tokens) != batch:
        raise TformerError(f"got {len(stop_tokens)} lists of stop tokens for {batch} sequences; give one per sequence")
    rows = [list(s) for s in stop_tokens] if per_row else [list(stop_tokens)] * batch
    matrix = torch.zeros(batch, vocab, dtype=torch.bool)
    for b, ids in enumerate(rows):
        for t in check_stop_ids(ids, vocab):
            matrix[b, t] = True
    return matrix.to(device)


def check_stop_ids(ids, vocab: int) -> list[int]:
    """``ids`` as a list if every one is a token id of the vocabulary, else one TformerError naming the first not."""
    ids = list(ids)
    bad = next((t for t in ids if isinstance(t, bool) or not isinstance(t, int) or not 0 <= t < vocab), None)
    if bad is not None:
        raise TformerError(f"stop token {bad!r} is outside the vocabulary [0, {vocab})")
    return ids


def fit_prefix(rows, cfg, limit: int, info: dict) -> tuple[list[list[int]], int]:
    """A decoder-only prompt continues the decoder's own text: keep its end if it is too long.
    Returns (rows, decoder tokens before the first new one)."""
    longest = max(len(r) for r in rows)
    if longest > limit:
        if not cfg.truncate:
            raise TformerError(f"prompt of {longest} tokens is longer than the context window of {limit}; "
                               "shorten it or pass --truncate to keep its last tokens")
        keep = max(1, limit - cfg.max_new_tokens)
        rows = [r[-keep:] for r in rows]
        info["truncated"] = True
    prefix = max(len(r) for r in rows)  # the padded batch shares one cache length
    if limit - prefix < 1:
        raise TformerError(f"the prompt fills the whole context window of {limit} tokens; nothing can be "
                           "generated. Shorten it or pass --truncate")
    return rows, prefix


def fit_source(rows, decoder_input_ids, mc, cfg, limit: int, info: dict):
    """A seq2seq prompt is the source (keep its start if too long); the decoder starts from
    ``decoder_input_ids`` or the start token. Returns (source rows, decoder start rows)."""
    longest = max(len(r) for r in rows)
    if longest > limit:
        if not cfg.truncate:
            raise TformerError(f"source of {longest} tokens is longer than the context window of {limit}; "
                               "shorten it or pass --truncate to keep its first tokens")
        rows = [r[:limit] for r in rows]
        info["truncated"] = True
    if decoder_input_ids is not None:
        start_rows = prompt_rows(decoder_input_ids, None)
        if len(start_rows) == 1 and len(rows) > 1:
            start_rows = start_rows * len(rows)
        if len({len(r) for r in start_rows}) != 1 or len(start_rows) != len(rows) or not start_rows[0]:
            raise TformerError("decoder_input_ids must give one non-empty row per source, all the same length")
    else:
        if mc.decoder_start_token_id is None:
            raise TformerError("decoder_start_token_id is not set in the model config; pass decoder_input_ids")
        start_rows = [[mc.decoder_start_token_id]] * len(rows)
    if limit - len(start_rows[0]) < 1:
        raise TformerError(f"decoder_input_ids already fill the context window of {limit} tokens")
    return rows, start_rows


def _free_bytes(device) -> int | None:
    if device.type == "cuda":
        return torch.cuda.mem_get_info(device)[0]
    return available_memory_bytes() if device.type == "cpu" else None


def check_size(model, cfg, batch: int, prefix: int, max_new: int, source: int, device) -> None:
    """Refuse, before anything is allocated, a request that cannot finish: more beams than tokens to
    choose from, more sequences than any real workload, or more memory than the device has free."""
    mc = model.config
    if cfg.num_beams > mc.vocab_size:
        raise TformerError(f"--num-beams {cfg.num_beams} is more than the {mc.vocab_size} tokens of the vocabulary; "
                           f"use at most {mc.vocab_size} (4 to 8 is usual)")
    rows = batch * cfg.num_beams
    if rows > MAX_ROWS:
        raise TformerError(f"{batch} sequences x {cfg.num_beams} beams = {rows:,} rows decoded at once, more than "
                           f"{MAX_ROWS:,}; lower --batch or --num-beams")
    param = next(model.parameters(), None)
    need = generation_bytes(mc, rows, prefix + max_new, prefix, source=source, use_cache=cfg.use_cache,
                            bytes_per=param.element_size() if param is not None else 4)
    free = _free_bytes(device)
    if free is not None and need["total"] > free:
        fix = "drop --no-cache, or " if not cfg.use_cache else ""
        raise TformerError(
            f"generating {rows:,} rows of {prefix + max_new} tokens needs at least {fmt.si(need['total'], 'B')} "
            f"(KV cache {fmt.si(need['kv_cache'], 'B')}) but {device.type} memory has {fmt.si(free, 'B')} free; "
            f"{fix}lower --batch, --num-beams or --max-new-tokens")


__all__ = ["MAX_ROWS", "check_size", "check_stop_ids", "filler_id", "fit_prefix", "fit_source", "pad_batch",
           "prompt_ids", "prompt_rows", "stop_matrix"]
