"""Compiled decoding: the model's own forward, over a preallocated KV cache (tformer.model.slot_cache), traced
once by ``torch.compile`` and replayed for every token.

    runner = compiled_runner(model)                    # the model's own runner, with runner.compiled set
    cache = runner.new_cache(rows, max_len)            # buffers of a rounded-up length, reused
    logits = runner.prefill(cache, ids, mask)          # the same forward, eager, into the buffers
    logits = runner.step(cache, tokens)                # the compiled graph (the first of a shape compiles it:
                                                       # cache.compile_seconds, kept apart from decode time)

Why it pays: an eager decode step at batch 1 is a few hundred small kernels, each dispatched from
Python. Reading the weights is the floor (bytes / bandwidth); the dispatch around each product is
time on top of it. The compiled graph fuses the elementwise work (norms, residuals, GELU, RoPE,
masking) into a few loops and runs the whole step without Python.

There is one forward: the graph is the model's ``forward`` (a decoder's) or ``decode`` (an encoder-decoder's)
called with a SlotCache, whose positions and masks are tensors, so nothing in it depends on how many tokens
were read. One graph per (rows, cache length, source length, dtype, device). Cache lengths are rounded up to
a power of two (at least 64, at most the context window) and the buffers for a shape are kept between
generations, so a second generation of a similar size neither recompiles nor allocates. On CUDA the graph is
replayed as a CUDA graph ("reduce-overhead"), which needs the buffers at fixed addresses: they are.

The compiled step freezes nothing: it reads the model's parameters at every call, so a model trained
further and decoded again sees its new weights without recompiling.
"""

from __future__ import annotations

import time
from collections import OrderedDict

import torch

from tformer.core.attention_kinds import ATTN_KINDS
from tformer.core.errors import TformerError
from tformer.model.base import TransformerModel
from tformer.model.linear import fixed_rows_graph
from tformer.model.path_choice import choose_paths
from tformer.model.runners import runner_for
from tformer.model.slot_cache import SlotCache, layer_windows

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


def check_compilable(config) -> None:
    """Raise one line naming why ``config`` cannot decode through the compiled step, if it cannot."""
    if not config.traits.decoder:
        raise TformerError(f"--compile speeds up decoding, and this {config.traits.label} model does not generate; "
                           "drop --compile")
    if config.traits.recurrent:
        raise TformerError("the compiled decode step walks attention blocks over a KV cache, and this recurrent model "
                           "has none (its step is one cell update); drop --compile")
    kind = config.attn_impl
    if ATTN_KINDS[kind].family != "exact" and kind != "sliding":
        raise TformerError(f"the compiled decode step runs exact or sliding-window attention; this model runs '{kind}'. "
                           "Drop --compile, or build it with attn_impl='sdpa'")
    if config.rope_scaling == "dynamic":
        raise TformerError("dynamic NTK RoPE scaling changes its base with every length, which a compiled step "
                           "cannot hold fixed; drop --compile, or use rope_scaling 'linear', 'ntk' or 'yarn'")


def next_logits(model, ids, kv, memory=None, memory_mask=None):
    """The model's own forward on ``ids`` (N, T) over the cache ``kv`` -> the next-token logits (N, V):
    what the compiled graph is, and what the eager prefill runs."""
    if memory is None:
        return model(ids, past_key_values=kv, logits_to_keep=1).logits[:, -1]
    return model.decode(ids, memory, memory_mask, cache=kv, logits_to_keep=1)[0][:, -1]


class CompiledStep:
    """A model's compiled decode step and the KV buffers it writes, one set per shape."""

    def __init__(self, model: TransformerModel, mode: str | None = None, backend: str = "inductor"):
        """mode: torch.compile's (default: CUDA graphs on CUDA, "default" elsewhere); backend: "inductor" (generated
        kernels), or "eager" / "aot_eager" (traced but run by ATen: checks the step without compiling code)."""
        check_compilable(model.config)
        self.model = model
        self.n_layers = len(model.decoder.order)  # depth (a shared layer counts at each depth)
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
        windows = layer_windows(model.config, self.n_layers)

        def step(tokens, buffers, lengths, positions, keep, cross, memory, memory_mask):
            # The cache is rebuilt from its tensors inside the graph: dynamo then guards on their shapes only.
            kv = SlotCache(buffers, windows, lengths, positions, keep, cross)
            return next_logits(model, tokens[:, None], kv, memory, memory_mask)

        options = {"fullgraph": True, "dynamic": False, "backend": backend}
        self._step = torch.compile(step, **options, **({"mode": mode} if backend == "inductor" else {}))

    def __deepcopy__(self, memo):
        # A copied model gets its own decoder on first use (compiled graphs and buffers are not copied).
        return None

    def buffers(self, rows: int, length: int, zero: bool = True) -> list[tuple[torch.Tensor, torch.Tensor]]:
        """Per layer (k, v) of (rows, H_kv, length, D), kept for the next generation of this shape; zeroed
        unless the caller overwrites every element (beam search's select copies whole rows in)."""
        key = (rows, length)
        found = self._buffers.pop(key, None)
        if found is None:
            c = self.model.config
            shape = (rows, c.n_kv_heads, length, c.head_dim)
            found = [(torch.zeros(shape, dtype=self.dtype, device=self.device),
                      torch.zeros(shape, dtype=self.dtype, device=self.device)) for _ in range(self.n_layers)]
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

    def step(self, kv: SlotCache, tokens: torch.Tensor, memory=None, memory_mask=None) -> torch.Tensor:
        """Run the compiled step: read ``tokens`` (N,) at each row's next column -> logits (N, V)."""
        cross = kv.cross_entries() if memory is not None else None
        warmed = self._shape_key(kv, memory, memory_mask) in self._compiled
        # Once a shape is compiled, only the guards that tell this step's graphs apart are evaluated: all of them
        # (one per weight, buffer and flag) cost 1.6 ms of a 12 ms SmolLM2 step on a 2-core EPYC, and nothing
        # they check changes between the steps of one decoder (weights are updated in place, paths are set
        # before warm(), and every shape goes through warm() first).
        args = (tokens, kv.buffers, kv.lengths, kv.positions, kv.keep, cross, memory, memory_mask)
        with torch.no_grad():  # one graph whatever the caller's grad mode (dynamo guards on it)
            try:
                with torch.compiler.set_stance(skip_guard_eval_unsafe=warmed), fixed_rows_graph():
                    logits = self._step(*args)
            except RuntimeError as exc:
                # What the kept guards cannot tell apart, dynamo refuses before running anything (beam search's
                # reordered rows are one such step): run it with every guard, compiling if it must.
                if "skip_guard_eval_unsafe" not in str(exc):
                    raise
                with fixed_rows_graph():
                    logits = self._step(*args)
        # A CUDA graph's output lives in memory the next replay overwrites: keep a copy.
        return logits.clone() if self.mode == "reduce-overhead" else logits

    # What a runner with a compiled step calls (tformer.model.runners: DecoderRunner, EncoderDecoderRunner) ---------
    def new_kv(self, rows: int, max_len: int | None, kv: bool = True) -> SlotCache:
        """A preallocated cache of ``rows`` x cache_length(max_len) columns over this step's kept buffers."""
        if not kv or max_len is None:
            raise TformerError("compiled decoding writes a preallocated KV cache; drop --no-cache (or reserve_cache=False) "
                               "or drop --compile")
        length = cache_length(max_len, self.model.config.max_positions)

        def pool(r):  # beam search's select moves rows into these (every element overwritten: no zeroing)
            return self.buffers(r, length, zero=False)
        return SlotCache.allocate(self.model.config, self.n_layers, rows, length, self.dtype, self.device,
                                  buffers=self.buffers(rows, length), pool=pool)

    def check_room(self, cache, t: int) -> None:
        """Raise unless ``t`` more tokens fit the cache's columns (counted on the host: cache.read)."""
        if cache.read + t > cache.kv.columns:
            raise ValueError(f"the preallocated KV cache holds {cache.kv.columns} positions; {cache.read + t} "
                             "are needed")

    def advance(self, cache, tokens: torch.Tensor, memory=None, memory_mask=None) -> torch.Tensor:
        """One compiled step of a runner's cache record: ``tokens`` (N,) -> logits (N, V); compiling a new shape
        is timed apart (cache.compile_seconds)."""
        if cache.read == 0:
            raise TformerError("the compiled step needs a prefilled cache: call prefill first")
        self.check_room(cache, 1)
        cache.compile_seconds += self.warm(cache.kv, memory, memory_mask)
        logits = self.step(cache.kv, tokens, memory, memory_mask)
        cache.read += 1
        return logits

    def _shape_key(self, kv: SlotCache, memory, memory_mask) -> tuple:
        """What one compiled graph is for: rows, cache columns, source length, a memory mask or not, dtype, device."""
        source = memory.shape[1] if memory is not None else 0
        return kv.rows, kv.columns, source, memory_mask is not None, self.dtype, self.device

    def warm(self, kv: SlotCache, memory=None, memory_mask=None) -> float:
        """Compile for ``kv``'s shapes if not done yet (one step whose write is then forgotten, so the cache is
        unchanged); return the seconds it took, 0 when the graph already existed."""
        key = self._shape_key(kv, memory, memory_mask)
        if key in self._compiled:
            return 0.0
        tokens = torch.zeros(kv.rows, dtype=torch.long, device=self.device)
        t = time.perf_counter()
        choose_paths(self.model)  # each Linear's path set and a kernel's operands packed, before tracing
        for _ in range(2 if self.mode == "reduce-overhead" else 1):  # CUDA graphs record on the second call
            self.step(kv, tokens, memory, memory_mask)
            kv.rewind(1)
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)
        self._compiled.add(key)
        return time.perf_counter() - t


def compiled_pool_step(model: TransformerModel, backend: str = "inductor"):
    """A decode step for serving's KV pool (tformer.generate.slot_pool): ``step(model, ids, view) -> logits``,
    the model's own forward over a SlotCache view, compiled as two graphs: one for any number of rows from 2 and
    one for a single row, both for any number of columns (those dimensions marked dynamic, where a graph per shape
    would cost minutes each on a small CPU). The single row has its own graph because torch specializes a
    dimension of size 1: the any-rows graph is traced at 2, and a lone request stepped through it would carry a
    passenger row, whose products cost the block kernel nearly as much as its own. Columns must be at least 2."""
    check_compilable(model.config)
    if backend not in BACKENDS:
        raise TformerError(f"compile backend {backend!r} is unknown; use one of: {', '.join(BACKENDS)}")
    windows = layer_windows(model.config, len(model.decoder.order))

    def traced(ids, buffers, lengths, positions, keep):
        return next_logits(model, ids, SlotCache(buffers, windows, lengths, positions, keep))

    def traced_one_row(ids, buffers, lengths, positions, keep):  # its own code object: its own graph cache
        return next_logits(model, ids, SlotCache(buffers, windows, lengths, positions, keep))

    rows_graph = torch.compile(traced, fullgraph=True, backend=backend)
    one_row_graph = torch.compile(traced_one_row, fullgraph=True, backend=backend)
    mark = torch._dynamo.mark_dynamic

    def step(_model, ids: torch.Tensor, view: SlotCache) -> torch.Tensor:
        one = ids.shape[0] == 1
        for k, v in view.buffers:
            for t in (k, v):
                mark(t, 2)
        mark(view.keep, 1)
        if not one:
            for t in (ids, view.lengths, view.positions, view.keep, *(t for kv in view.buffers for t in kv)):
                mark(t, 0)
        with torch.no_grad():
            return (one_row_graph if one else rows_graph)(ids, view.buffers, view.lengths, view.positions, view.keep)

    return step


BACKENDS = ("inductor", "eager", "aot_eager")


def compiled_runner(model: TransformerModel, mode: str | None = None, backend: str = "inductor"):
    """The runner of ``model`` with its compiled step: the same runner class, whose caches are preallocated and whose
    steps run the graph. The CompiledStep (compiled graphs, buffers) is made once per model, mode and backend, kept
    on the model, and reused by every later call, so repeated generations do not recompile. One generation at a
    time per model: concurrent ones of one shape would share buffers."""
    if backend not in BACKENDS:
        raise TformerError(f"compile backend {backend!r} is unknown; use one of: {', '.join(BACKENDS)}")
    check_compilable(model.config)
    steps = model.__dict__.setdefault("_compiled_steps", {})  # a plain attribute: not in the state dict
    key = (mode, backend)
    found, param = steps.get(key), next(model.parameters())
    if found is None or (found.device, found.dtype) != (param.device, param.dtype):  # new, or the model moved
        steps[key] = CompiledStep(model, mode, backend)
    runner = runner_for(model)
    runner.compiled = steps[key]
    return runner


__all__ = ["BACKENDS", "CompiledStep", "cache_length",
           "check_compilable", "compiled_pool_step", "compiled_runner", "next_logits"]
