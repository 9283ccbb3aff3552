"""Compiled decoding: the same runner API as eager, with each decode step a ``torch.compile``d graph over
a preallocated KV cache (tformer.model.static_step).

    runner = compiled_runner(model)                    # or generate(model, ids, compile=True)
    cache = runner.new_cache(rows, max_len)            # buffers of a rounded-up length, reused
    logits = runner.prefill(cache, ids, mask)          # eager, into the buffers
    logits = runner.step(cache, tokens)                # the compiled graph (the first of a shape compiles it:
                                                       # cache.compile_seconds, kept apart from decode time)

Why it pays: an eager decode step at batch 1 is a few hundred small kernels, each dispatched from
Python. Reading the weights is the floor (bytes / bandwidth); the dispatch around each product is
time on top of it. The compiled graph fuses the elementwise work (norms, residuals, GELU, RoPE,
masking) into a few loops and runs the whole step without Python.

What stays fixed: one graph per (rows, cache length, source length, dtype, device). Cache lengths are
rounded up to a power of two (at least 64, at most the context window) and the buffers for a shape
are kept between generations, so a second generation of a similar size neither recompiles nor
allocates. The prefill runs eagerly (its length differs for every prompt). On CUDA the graph is
replayed as a CUDA graph ("reduce-overhead"), which needs the buffers at fixed addresses: they are.

The compiled step freezes nothing: it reads the model's parameters at every call, so a model trained
further and decoded again sees its new weights without recompiling.
"""

from __future__ import annotations

import time
from collections import OrderedDict
from dataclasses import dataclass

import torch

from tformer.core.errors import TformerError
from tformer.model.base import TransformerModel
from tformer.model.cache import KVCache
from tformer.model.quantized import prepare_quantized
from tformer.model.runners import DecoderRunner, EncoderDecoderRunner, runner_for
from tformer.model.static_step import check_static_step, static_step

MIN_LENGTH = 64  # the shortest cache a graph is compiled for: short generations share one graph
KEPT_SHAPES = 4  # buffer sets kept per model (beam search holds two at once: batch rows, then batch x beams)
# Dynamo keeps up to this many graphs per function before falling back to eager; each model and shape
# adds one, and a silent fallback would make --compile a no-op, so the default (8) is raised.
RECOMPILE_LIMIT = 64


def cache_length(needed: int, max_positions: int) -> int:
    """The compiled cache length for ``needed`` positions: a power of two >= MIN_LENGTH, at most the
    context window (but never less than needed)."""
    length = MIN_LENGTH
    while length < needed:
        length *= 2
    return max(needed, min(length, max_positions))


@dataclass
class StepState:
    """The fixed-shape inputs of the compiled step besides the KV buffers."""

    keep: torch.Tensor  # (N, L) bool: False at padding columns
    slot: torch.Tensor  # () long: the column the next step writes
    positions: torch.Tensor  # (N,) long: the next token's position id in each row
    cross_bias: torch.Tensor | None = None  # (N, 1, 1, S) additive: -inf at padded source tokens


class StaticDecoder:
    """A model's compiled decode step and the KV buffers it writes, one set per shape."""

    def __init__(self, model: TransformerModel, mode: str | None = None, backend: str = "inductor"):
        """mode: torch.compile's (default: CUDA graphs on CUDA, "default" elsewhere); backend: "inductor" (generated
        kernels), or "eager" / "aot_eager" (traced but run by ATen: checks the step without compiling code)."""
        check_static_step(model.config)
        self.model = model
        self.stack = model.decoder
        param = next(model.parameters())
        self.device, self.dtype = param.device, param.dtype
        if mode is None:
            mode = "reduce-overhead" if self.device.type == "cuda" and backend == "inductor" else "default"
        self.mode, self.backend = mode, backend
        self._buffers: OrderedDict[tuple[int, int], list] = OrderedDict()
        self._compiled: set[tuple] = set()  # shapes the step has been compiled for
        dynamo = torch._dynamo.config
        dynamo.recompile_limit = max(dynamo.recompile_limit, RECOMPILE_LIMIT)
        dynamo.accumulated_recompile_limit = max(dynamo.accumulated_recompile_limit, 4 * RECOMPILE_LIMIT)
        stack = self.stack

        def step(tokens, slot, positions, keep, self_kv, cross_kv, cross_bias):
            return static_step(model, stack, tokens, slot, positions, keep, self_kv, cross_kv, cross_bias)

        options = {"fullgraph": True, "dynamic": False, "backend": backend}
        self._step = torch.compile(step, **options, **({"mode": mode} if backend == "inductor" else {}))

    def __deepcopy__(self, memo):
        # A copied model gets its own decoder on first use (compiled graphs and buffers are not copied).
        return None

    def buffers(self, rows: int, length: int, zero: bool = True) -> list[tuple[torch.Tensor, torch.Tensor]]:
        """Per layer (k, v) of (rows, H_kv, length, D), kept for the next generation of this shape; zeroed
        unless the caller overwrites every element (beam search's reorder copies whole rows in)."""
        key = (rows, length)
        found = self._buffers.pop(key, None)
        if found is None:
            c = self.model.config
            shape = (rows, c.n_kv_heads, length, c.head_dim)
            found = [(torch.zeros(shape, dtype=self.dtype, device=self.device),
                      torch.zeros(shape, dtype=self.dtype, device=self.device)) for _ in self.stack.order]
            if self.device.type == "cuda":  # CUDA graphs replay reads and writes at these addresses
                for k, v in found:
                    torch._dynamo.mark_static_address(k)
                    torch._dynamo.mark_static_address(v)
            while len(self._buffers) >= KEPT_SHAPES:
                self._buffers.popitem(last=False)
        elif zero:
            for k, v in found:  # a stale key from an earlier generation is masked, but NaN * 0 is not 0
                k.zero_()
                v.zero_()
        self._buffers[key] = found
        return found

    def step(self, cache, tokens: torch.Tensor) -> torch.Tensor:
        """Run the compiled step on ``cache`` (read ``tokens`` (N,) at its slot) -> logits (N, V)."""
        s, kv = cache.static, cache.kv
        cross = None
        if self.model.config.traits.seq2seq:
            cross = [kv.get_cross(i) for i in range(kv.n_layers)]
        with torch.no_grad():  # one graph whatever the caller's grad mode (dynamo guards on it)
            logits = self._step(tokens, s.slot, s.positions, s.keep, kv.self_entries(), cross, s.cross_bias)
        # A CUDA graph's output lives in memory the next replay overwrites: keep a copy.
        return logits.clone() if self.mode == "reduce-overhead" else logits

    def warm(self, cache) -> float:
        """Compile for ``cache``'s shapes if not done yet (one step whose write the next step overwrites,
        so the cache is unchanged); return the seconds it took, 0 when the graph already existed."""
        kv = cache.kv
        source = cache.static.cross_bias.shape[-1] if cache.static.cross_bias is not None else 0
        key = (cache.rows, kv.max_length, source, self.dtype, self.device)
        if key in self._compiled:
            return 0.0
        tokens = torch.zeros(cache.rows, dtype=torch.long, device=self.device)
        t = time.perf_counter()
        prepare_quantized(self.model, cache.rows, self.dtype)  # the kernels' choices and packing, before tracing
        for _ in range(2 if self.mode == "reduce-overhead" else 1):  # CUDA graphs record on the second call
            self.step(cache, tokens)
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)
        self._compiled.add(key)
        return time.perf_counter() - t


class _Compiled:
    """Mixed into a runner: the same API, with the static cache and the compiled step."""

    decoder: StaticDecoder

    def new_cache(self, rows, max_len=None, kv=True):
        if not kv or max_len is None:
            raise TformerError("compiled decoding writes a preallocated KV cache; drop --no-cache (or static_cache=False) "
                               "or drop --compile")
        length = cache_length(max_len, self.config.max_positions)
        cache = super().new_cache(rows, None, kv=False)
        n_layers = len(self.decoder.stack.order)  # depth (a shared layer counts at each depth)

        def pool(r):  # beam search's reorder moves rows into these (every element overwritten: no zeroing)
            return self.decoder.buffers(r, length, zero=False)
        cache.kv = KVCache(n_layers, length, buffers=self.decoder.buffers(rows, length), pool=pool)
        return cache

    def _start(self, cache, mask, source_mask=None):
        """After the eager prefill: the step's fixed-shape inputs."""
        kv, device = cache.kv, self.device
        read = kv.length
        keep = torch.ones(cache.rows, kv.max_length, dtype=torch.bool, device=device)
        positions = torch.full((cache.rows,), read, dtype=torch.long, device=device)
        if mask is not None:
            keep[:, :read] = mask.bool()
            positions = mask.sum(dim=1)  # real tokens read = the next token's position id
        cross_bias = None
        if source_mask is not None:
            zero = torch.zeros((), dtype=self.decoder.dtype, device=device)
            cross_bias = torch.where(source_mask.bool(), zero, float("-inf"))[:, None, None, :]
        elif self.config.traits.seq2seq:
            memory = kv.get_cross(0)[0]
            cross_bias = torch.zeros(cache.rows, 1, 1, memory.shape[2], dtype=self.decoder.dtype, device=device)
        slot = torch.tensor(read, dtype=torch.long, device=device)
        cache.static = StepState(keep, slot, positions, cross_bias)

    def step(self, cache, tokens):
        if cache.static is None:
            raise TformerError("the compiled step needs a prefilled cache: call prefill first")
        if cache.kv.length >= cache.kv.max_length:
            raise ValueError(f"static KV cache holds {cache.kv.max_length} positions; step needs {cache.kv.length + 1}")
        cache.compile_seconds += self.decoder.warm(cache)  # the first step of a shape compiles (timed apart)
        logits = self.decoder.step(cache, tokens)
        s = cache.static
        s.slot.add_(1)
        s.positions.add_(1)
        cache.kv.length += 1
        return logits

    def reorder(self, cache, index):
        super().reorder(cache, index)
        s = cache.static
        if s is not None:
            s.keep, s.positions = s.keep[index], s.positions[index]
            if s.cross_bias is not None:
                s.cross_bias = s.cross_bias[index]

    def rewind(self, cache, n):
        if n <= 0:
            return
        cache.kv.rewind(n)
        if cache.static is not None:
            cache.static.slot.sub_(n)
            cache.static.positions.sub_(n)


class CompiledDecoderRunner(_Compiled, DecoderRunner):
    def prefill(self, cache, ids, mask=None, *, source=None, source_mask=None, all_logits=False):
        logits = super().prefill(cache, ids, mask, source=source, source_mask=source_mask, all_logits=all_logits)
        if logits is not None:
            self._start(cache, cache.mask)
        return logits


class CompiledEncoderDecoderRunner(_Compiled, EncoderDecoderRunner):
    def prefill(self, cache, ids, mask=None, *, source=None, source_mask=None, all_logits=False):
        logits = super().prefill(cache, ids, mask, source=source, source_mask=source_mask, all_logits=all_logits)
        if logits is not None:
            self._start(cache, None, cache.source_mask)
        return logits

    def rewind(self, cache, n):
        if n > 0 and cache.kv.length - n <= 0:
            raise TformerError("a compiled encoder-decoder cache cannot rewind past the decoder's first token")
        super().rewind(cache, n)


BACKENDS = ("inductor", "eager", "aot_eager")


def compiled_runner(model: TransformerModel, mode: str | None = None, backend: str = "inductor"):
    """The compiled runner of ``model``. Its StaticDecoder (compiled graphs, buffers) is made once per model,
    mode and backend, kept on the model, and reused by every later call, so repeated generations do not
    recompile. One generation at a time per model: concurrent ones of one shape would share buffers."""
    if backend not in BACKENDS:
        raise TformerError(f"compile backend {backend!r} is unknown; use one of: {', '.join(BACKENDS)}")
    base = runner_for(model)
    decoders = model.__dict__.setdefault("_static_decoders", {})  # a plain attribute: not in the state dict
    key = (mode, backend)
    found, param = decoders.get(key), next(model.parameters())
    if found is None or (found.device, found.dtype) != (param.device, param.dtype):  # new, or the model moved
        decoders[key] = StaticDecoder(model, mode, backend)
    cls = CompiledEncoderDecoderRunner if base.takes_source else CompiledDecoderRunner
    runner = cls(model)
    runner.decoder = decoders[key]
    return runner


__all__ = ["BACKENDS", "CompiledDecoderRunner", "CompiledEncoderDecoderRunner", "StaticDecoder", "StepState", "cache_length",
           "compiled_runner"]
