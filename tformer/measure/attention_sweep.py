"""Attention kinds against sequence length: one attention call per (kind, n), timed forward and
forward+backward, its peak memory measured, each beside the ledger's prediction for the same call.

The call: batch 1, ``heads`` x ``head_dim`` (a small model's: 4 x 64), fp32, q = k = v sized (1, H, n, D),
causal where the kind can be (core.attention_kinds.ATTN_KINDS), else bidirectional. The mask is built
inside the call, so a kind that needs a dense (n, n) bias pays for it here (in a model one mask serves
every layer). Forward runs under no_grad; forward+backward runs the forward with q, k, v requiring
gradients and back-propagates a fixed output gradient.

Predicted (ledger, no torch): the kind's rows (cost.attention.attention_rows) for this AttentionCall,
plus their backward rows (cost.oplist.backward_op) for forward+backward; FLOPs and bytes are the rows'
sums, time is the roofline of those rows on the machine's measured profile (cost.roofline: the bench's
matmul curve and bandwidths; no speed is assumed here). Predicted peak attention memory, a convention
on the rows' ``scores_bytes`` S (what the kind keeps of the score matrix: n x n for the step-by-step
path, a tile for tiled, n x w for a window):
    forward           out + 2 S      (a softmax's input and output are alive together)
    forward+backward  4 out + 3 S    (out and the gradients of q, k, v; the kept weights, their gradient
                                      and the scores' gradient)
Measured peak: tformer.measure.memory_peak (tensors the call allocated, above what existed before).

Budgets: a kind stops at the first n whose measured call took longer than ``time_budget_s``, and
before an n whose predicted call would take more than ``PREDICTED_OVER`` times that, or whose
predicted peak exceeds ``memory_budget``; the sweep stops every kind once ``total_budget_s`` is spent.
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass, field, fields, replace
from types import SimpleNamespace

import torch

from tformer.core import fmt
from tformer.core.attention_kinds import ATTN_KINDS, AttnOptions
from tformer.core.config import ModelConfig
from tformer.core.errors import TformerError
from tformer.cost.attention import ATTENTION_COSTS, attention_rows
from tformer.cost.attention_call import AttentionCall
from tformer.cost.oplist import backward_op
from tformer.cost.roofline import roofline
from tformer.machine.profile_store import load_measured_device
from tformer.measure.bench import time_calls
from tformer.measure.memory_peak import peak_bytes
from tformer.measure.optime import call_overhead
from tformer.model.attention.registry import ATTENTION, make_attention
from tformer.model.masks import build_mask

# The settings every bench and the report give the kinds: one value per ModelConfig.attn_* field;
# each kind reads only the fields its ATTN_KINDS row names. KIND_SETTINGS overrides them per kind.
SETTINGS = {"attn_window": 256, "attn_dilation": 1, "attn_global": 2, "attn_block": 64, "attn_random": 3,
            "attn_features": 256, "attn_proj": 256, "attn_hashes": 1, "attn_seed": 0}
KIND_SETTINGS: dict[str, dict] = {}
# The quality bench trains at 128 tokens, where a 256-token window would be full attention.
QUALITY_SETTINGS = {**SETTINGS, "attn_window": 32, "attn_block": 16, "attn_random": 1, "attn_features": 64,
                    "attn_proj": 32}
OPTION_FIELD = {"attn_window": "window", "attn_dilation": "dilation", "attn_global": "global_tokens",
                "attn_block": "block", "attn_random": "random", "attn_features": "features", "attn_proj": "proj",
                "attn_hashes": "hashes", "attn_seed": "seed"}
MODES = ("forward", "forward+backward")
PREDICTED_OVER = 4  # skip an n whose predicted time is this many budgets (the model may be off 2x)
# The textbook's selection guide by sequence length (lower bound inclusive, upper exclusive).
TEXTBOOK_GUIDE = ((0, 512, "plain attention"), (512, 2048, "Flash, else a window of 256"),
                  (2048, 8192, "Longformer / BigBird, or Flash"), (8192, None, "Performer"))


def available_kinds(kinds=None) -> tuple[list[str], list[str]]:
    """(kinds to run, notes on the skipped): a kind runs when both the model's and the ledger's
    registries hold it."""
    wanted = list(kinds) if kinds else list(ATTN_KINDS)
    unknown = [k for k in wanted if k not in ATTN_KINDS]
    if unknown:
        raise TformerError(f"unknown attention kind(s) {', '.join(unknown)}; choose from {', '.join(ATTN_KINDS)}")
    run = [k for k in wanted if k in ATTENTION and k in ATTENTION_COSTS]
    notes = [f"{k}: not in this build's attention registry (skipped)" for k in wanted if k not in run]
    return run, notes


def kind_settings(kind: str, base: dict | None = None) -> dict:
    """The attn_* fields kind ``kind`` reads, with their bench values."""
    merged = {**(SETTINGS if base is None else base), **KIND_SETTINGS.get(kind, {})}
    return {name: merged[name] for name in ATTN_KINDS[kind].options if name in merged}


def settings_label(settings: dict) -> str:
    return ", ".join(f"{name.removeprefix('attn_')} {value}" for name, value in settings.items()) or "-"


def kind_options(kind: str, n: int, base: dict | None = None) -> AttnOptions:
    """One layer's AttnOptions for ``kind`` at ``n`` positions: bench settings over ModelConfig's defaults."""
    defaults = {f.name: f.default for f in fields(ModelConfig) if f.name in OPTION_FIELD}
    values = {**defaults, **(SETTINGS if base is None else base), **KIND_SETTINGS.get(kind, {})}
    return AttnOptions(kind=kind, layer=0, max_positions=n, **{OPTION_FIELD[k]: v for k, v in values.items()})


@dataclass
class SweepSpec:
    ns: tuple[int, ...] = (256, 512, 1024, 2048, 4096, 8192, 16384)
    modes: tuple[str, ...] = MODES
    heads: int = 4
    head_dim: int = 64
    batch: int = 1
    time_budget_s: float = 2.0  # per call
    memory_budget: int = 4 * 2**30  # predicted peak bytes
    total_budget_s: float | None = None  # the whole sweep
    reps: int = 3
    min_rep_s: float = 0.05
    attention_flops: str = "full"  # full (what FlopCounterMode counts) | causal (only the unmasked pairs)
    device: str = "cpu"

    def validate(self) -> None:
        if not self.ns or any(n < 2 for n in self.ns):
            raise TformerError("sequence lengths must be at least 2; give e.g. --max-n 2048")
        bad = [m for m in self.modes if m not in MODES]
        if bad:
            raise TformerError(f"unknown mode(s) {', '.join(bad)}; choose from {', '.join(MODES)}")
        if self.attention_flops not in ("full", "causal"):
            raise TformerError(f"attention_flops {self.attention_flops!r} is unknown; choose full or causal")


@dataclass
class Point:
    kind: str
    n: int
    mode: str
    measured_s: float
    predicted_s: float | None
    flops: int
    bytes: int
    measured_peak: int
    predicted_peak: int

    @property
    def ratio(self) -> float | None:
        return self.predicted_s / self.measured_s if self.predicted_s and self.measured_s else None

    def to_dict(self) -> dict:
        return {**self.__dict__, "ratio": self.ratio}


@dataclass
class KindSweep:
    kind: str
    family: str
    causal: bool
    settings: dict
    points: list[Point] = field(default_factory=list)
    stopped: dict = field(default_factory=dict)  # mode -> why it stopped before the last n

    def at(self, mode: str) -> dict[int, Point]:
        return {p.n: p for p in self.points if p.mode == mode}

    def to_dict(self) -> dict:
        return {"kind": self.kind, "family": self.family, "causal": self.causal, "settings": self.settings,
                "points": [p.to_dict() for p in self.points], "stopped": self.stopped}


# ------------------------------------------------------------------------------------------------
# The ledger's side
# ------------------------------------------------------------------------------------------------

def attention_call(kind: str, n: int, spec: SweepSpec, base: dict | None = None) -> AttentionCall:
    causal = ATTN_KINDS[kind].causal
    pairs = n * (n + 1) // 2 if causal and spec.attention_flops == "causal" else n * n
    return AttentionCall(path="attn", layer=0, stack="decoder" if causal else "encoder", batch=spec.batch,
                         heads=spec.heads, kv_heads=spec.heads, head_dim=spec.head_dim, tq=n, tk=n, pairs=pairs,
                         act_bytes=4, extra_flops=1 if causal else 0, cache_bytes=0, dropout=0.0, causal=causal,
                         options=kind_options(kind, n, base))


def predict(kind: str, n: int, mode: str, spec: SweepSpec, device=None, base: dict | None = None) -> dict:
    """The ledger's FLOPs, bytes, peak attention memory and (given a device) roofline time of one call."""
    call = attention_call(kind, n, spec, base)
    rows = attention_rows(kind, call)
    scores = sum(op.scores_bytes for op in rows)
    out = spec.batch * spec.heads * n * spec.head_dim * call.act_bytes
    if mode == "forward+backward":
        rows = rows + [backward_op(op) for op in reversed(rows)]
        peak = 4 * out + 3 * scores
    else:
        peak = out + 2 * scores
    time_s = None
    if device is not None:
        t = roofline(SimpleNamespace(ops=rows, workload=SimpleNamespace(dtype="fp32")), device).time_s
        time_s = t if isinstance(t, float) else None
    return {"flops": sum(op.flops for op in rows), "bytes": sum(op.bytes for op in rows), "peak": peak,
            "time_s": time_s}


def prediction_device(device: str = "cpu"):
    """This machine's measured profile as a Device (with the per-call overhead `tformer profile` adds,
    measured now when the profile lacks it), or None when no profile is saved (`tformer bench --quick`)."""
    measured = load_measured_device(device=device)
    if measured is not None and measured.call_overhead_s is None and device == "cpu":
        measured = replace(measured, call_overhead_s=call_overhead())
    return measured


# ------------------------------------------------------------------------------------------------
# The measured side
# ------------------------------------------------------------------------------------------------

def call_fn(kind: str, n: int, mode: str, spec: SweepSpec, base: dict | None = None):
    """A no-argument function running one attention call of ``kind`` at ``n`` (its inputs made once)."""
    gen = torch.Generator().manual_seed(n)
    shape = (spec.batch, spec.heads, n, spec.head_dim)
    q, k, v = (torch.randn(shape, generator=gen).to(spec.device) for _ in range(3))
    module = make_attention(kind_options(kind, n, base), spec.heads, spec.head_dim).to(spec.device)
    causal, scale = ATTN_KINDS[kind].causal, 1.0 / math.sqrt(spec.head_dim)
    if mode == "forward":
        module.eval()

        def forward():
            with torch.no_grad():
                module(q, k, v, build_mask(n, n, causal=causal, device=spec.device), scale, 0.0)
        return forward
    for t in (q, k, v):
        t.requires_grad_(True)
    grad = torch.ones(shape, device=spec.device)

    def forward_backward():
        for t in (q, k, v):
            t.grad = None
        module.zero_grad(set_to_none=True)
        out, _ = module(q, k, v, build_mask(n, n, causal=causal, device=spec.device), scale, 0.0)
        out.backward(grad)
    return forward_backward


def _sync(device: str):
    if device.startswith("cuda"):
        return lambda: torch.cuda.synchronize(device)
    return lambda: None


def measure(kind: str, n: int, mode: str, spec: SweepSpec, base: dict | None = None) -> tuple[float, int]:
    """(best seconds per call over the repetitions, peak bytes). The best, not the median: on a shared
    machine the slower repetitions measure the neighbours. The memory call doubles as a warm-up."""
    fn = call_fn(kind, n, mode, spec, base)
    peak = peak_bytes(fn, spec.device)
    times, _, _ = time_calls(fn, _sync(spec.device), spec.reps, spec.min_rep_s, warmup=1)
    return min(times), peak


def sweep_kind(kind: str, spec: SweepSpec, device=None, deadline: float | None = None, progress=None) -> KindSweep:
    """Every n of ``spec`` for one kind, each mode until its budget stops it."""
    info = ATTN_KINDS[kind]
    result = KindSweep(kind, info.family, info.causal, kind_settings(kind))
    for n in spec.ns:
        for mode in spec.modes:
            if mode in result.stopped:
                continue
            pred = predict(kind, n, mode, spec, device)
            why = None
            if pred["peak"] > spec.memory_budget:
                why = f"stopped before n={n}: predicted peak {fmt.gib(pred['peak'])} > {fmt.gib(spec.memory_budget)}"
            elif pred["time_s"] and pred["time_s"] > PREDICTED_OVER * spec.time_budget_s:
                why = (f"stopped before n={n}: predicted {fmt.seconds(pred['time_s'])} per call > "
                       f"{PREDICTED_OVER} x {fmt.seconds(spec.time_budget_s)}")
            elif deadline is not None and time.perf_counter() > deadline:
                why = f"stopped before n={n}: the sweep's {fmt.seconds(spec.total_budget_s)} budget is spent"
            if why:
                result.stopped[mode] = why
                continue
            if progress:
                progress(f"{kind} n={n} {mode}")
            seconds, peak = measure(kind, n, mode, spec)
            result.points.append(Point(kind, n, mode, seconds, pred["time_s"], pred["flops"], pred["bytes"],
                                       peak, pred["peak"]))
            if seconds > spec.time_budget_s and n != spec.ns[-1]:
                result.stopped[mode] = (f"stopped after n={n}: {fmt.seconds(seconds)} per call > "
                                        f"{fmt.seconds(spec.time_budget_s)}")
    return result


def sweep(spec: SweepSpec, device=None, kinds=None, progress=None) -> tuple[list[KindSweep], list[str]]:
    """Every available kind (or ``kinds``) over ``spec``; also the notes on kinds skipped."""
    spec.validate()
    run, notes = available_kinds(kinds)
    end = time.perf_counter() + spec.total_budget_s if spec.total_budget_s else None
    out = []
    for i, kind in enumerate(run):
        # Each kind gets an equal share of what is left, so the last kinds are not starved by the first;
        # what a kind leaves unused passes to the ones after it.
        deadline = None if end is None else time.perf_counter() + (end - time.perf_counter()) / (len(run) - i)
        out.append(sweep_kind(kind, spec, device, deadline, progress))
    return out, notes


# ------------------------------------------------------------------------------------------------
# Reading a sweep: crossover against sdpa, the measured selection guide
# ------------------------------------------------------------------------------------------------

def crossover(results: list[KindSweep], kind: str, mode: str, against: str = "sdpa") -> tuple[int | None, str]:
    """The smallest n from which ``kind`` is faster than ``against`` at every larger n both reached."""
    by_kind = {r.kind: r.at(mode) for r in results}
    if kind not in by_kind or against not in by_kind:
        return None, f"{against} not measured" if kind in by_kind else f"{kind} not measured"
    mine, theirs = by_kind[kind], by_kind[against]
    common = sorted(set(mine) & set(theirs))
    if not common:
        return None, "no common n"
    faster = [mine[n].measured_s < theirs[n].measured_s for n in common]
    first = None
    for i in range(len(common) - 1, -1, -1):
        if not faster[i]:
            break
        first = common[i]
    if first is None:
        return None, f"never up to {common[-1]}"
    return first, f"n >= {first}" + (f" (compared up to {common[-1]})" if common[-1] != max(mine) else "")


def _fastest(results: list[KindSweep], mode: str, ns: list[int], exact: bool) -> str | None:
    """The kind with the least total time over ``ns`` among those measured at all of them (else at the
    largest n any reached)."""
    pool = [r for r in results if r.family == "exact" or not exact]
    full = [r for r in pool if all(n in r.at(mode) for n in ns)]
    if not full:
        reached = [n for n in ns if any(n in r.at(mode) for r in pool)]
        if not reached:
            return None
        ns, full = [max(reached)], [r for r in pool if max(reached) in r.at(mode)]
    return min(full, key=lambda r: sum(r.at(mode)[n].measured_s for n in ns)).kind


def selection_guide(results: list[KindSweep], mode: str = "forward") -> list[dict]:
    """Per textbook band of n: the textbook's choice, and the fastest exact kind and fastest kind overall
    measured here."""
    measured = sorted({p.n for r in results for p in r.points if p.mode == mode})
    rows = []
    for lo, hi, textbook in TEXTBOOK_GUIDE:
        ns = [n for n in measured if n >= lo and (hi is None or n < hi)]
        band = f"{lo}-{hi}" if hi else f">= {lo}"
        if lo == 0:
            band = f"< {hi}"
        rows.append({"band": band, "textbook": textbook, "ns": ns,
                     "fastest_exact": _fastest(results, mode, ns, exact=True) if ns else None,
                     "fastest": _fastest(results, mode, ns, exact=False) if ns else None})
    return rows


def memory_target(results: list[KindSweep], spec: SweepSpec, n: int = 8192, kind: str = "tiled",
                  against: str = "reference", mode: str = "forward") -> str:
    """The issue's target line: ``kind``'s peak attention memory at ``n`` over ``against``'s (<= 1/10)."""
    got = {r.kind: r.at(mode).get(n) for r in results}
    if got.get(kind) is None:
        return f"target: {kind} at n = {n} peak memory <= 1/10 of {against}'s: {kind} not measured at n = {n}"
    mine = got[kind].measured_peak
    theirs = got.get(against)
    if theirs is None:
        ref, how = predict(against, n, mode, spec)["peak"], "predicted (not measured: budget)"
    else:
        ref, how = theirs.measured_peak, "measured"
    ratio = mine / ref if ref else float("inf")
    verdict = "met" if ratio <= 0.1 else "MISSED"
    return (f"target: {kind} at n = {n} peak attention memory {fmt.gib(mine)} vs {against}'s {fmt.gib(ref)} "
            f"({how}): {ratio:.3f} of it, {verdict} (<= 1/10)")


# ------------------------------------------------------------------------------------------------
# Rows the bench prints and the report shows
# ------------------------------------------------------------------------------------------------

POINT_HEADERS = ["kind", "n", "measured", "predicted", "predicted / measured", "peak memory measured",
                 "predicted", "FLOPs (ledger)"]


def point_rows(results: list[KindSweep], mode: str) -> list[list[str]]:
    rows = []
    for r in results:
        for p in sorted(r.at(mode).values(), key=lambda p: p.n):
            rows.append([r.kind, str(p.n), fmt.seconds(p.measured_s),
                         fmt.seconds(p.predicted_s) if p.predicted_s else "unknown",
                         f"{p.ratio:.2f}" if p.ratio else "-", fmt.gib(p.measured_peak),
                         fmt.gib(p.predicted_peak), fmt.si(p.flops, "FLOP")])
    return rows


CROSSOVER_HEADERS = ["kind", "family", "settings", "faster than sdpa (forward)", "(forward+backward)", "stopped"]


def crossover_rows(results: list[KindSweep]) -> list[list[str]]:
    rows = []
    for r in results:
        if r.kind == "sdpa":
            continue
        cells = [crossover(results, r.kind, mode)[1] if r.at(mode) else "-" for mode in MODES]
        rows.append([r.kind, r.family, settings_label(r.settings), *cells,
                     "; ".join(f"{m}: {why}" for m, why in r.stopped.items()) or "-"])
    return rows


GUIDE_HEADERS = ["n", "textbook", "fastest exact kind here", "fastest kind here"]


def guide_rows(results: list[KindSweep], mode: str = "forward") -> list[list[str]]:
    return [[g["band"], g["textbook"], g["fastest_exact"] or "not measured", g["fastest"] or "not measured"]
            for g in selection_guide(results, mode)]


QUALITY_HEADERS = ["kind", "family", "settings", "validation loss", "vs sdpa"]


def quality_rows(record: dict) -> list[list[str]]:
    """The quality bench's record (bench/attention_quality.py) as rows: each kind's validation loss and
    its difference from exact attention's."""
    exact = next((r["val_loss"] for r in record["kinds"] if r["kind"] == record["exact"]), None)
    rows = []
    for r in record["kinds"]:
        diff = "-" if r["kind"] == record["exact"] or exact is None else f"{r['val_loss'] - exact:+.3f}"
        rows.append([r["kind"], r["family"], settings_label(r["settings"]), f"{r['val_loss']:.3f}", diff])
    return rows


__all__ = ["CROSSOVER_HEADERS", "GUIDE_HEADERS", "KIND_SETTINGS", "MODES", "POINT_HEADERS", "QUALITY_HEADERS",
           "QUALITY_SETTINGS",
           "SETTINGS", "TEXTBOOK_GUIDE", "KindSweep", "Point", "SweepSpec", "available_kinds", "crossover",
           "crossover_rows", "guide_rows", "kind_options", "kind_settings", "measure", "memory_target", "point_rows",
           "predict", "prediction_device", "quality_rows", "selection_guide", "settings_label", "sweep", "sweep_kind"]
