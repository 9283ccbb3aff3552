"""Per-op measurement of a real model, lined up with the ledger's op names.

How (and why this way):

- Synchronised timers at module boundaries. Every module whose path is a ledger op name
  ("decoder.layers.0.attn.q_proj") gets a forward pre-hook and a forward hook, and, for training,
  a full backward pre-hook (gradient of its output ready) and a full backward hook (gradient of its
  input computed). Each hook synchronises the device and reads ``time.perf_counter``. torch.profiler
  would give kernel times, but in the backward pass it names aten ops, not modules; the hooks give
  rows that carry the ledger's names directly.
- The steps the ledger names but that are no module of their own (attention's scores, softmax and
  context, the activation, residual adds, the loss) run *between* module hooks. The time between
  two hooked modules is charged to the ledger ops that lie between them in the ledger's order;
  when several lie there (scores + softmax + context), they form one row, named by its first op,
  that lists the others in ``covers``. When none lies there (a reshape between q_proj and k_proj,
  the add of the position table), the time goes to the op just before.
- FLOPs per row come from the same attribution, counted by torch's FlopCounterMode formulas
  (``tformer.measure.flops.FORMULAS``: torch's registry plus what the installed torch lacks) in a
  separate, untimed pass on the counted path, so counting never slows the timed steps.
"""

from __future__ import annotations

import statistics
import time
from dataclasses import dataclass, field

import torch
from torch.utils._python_dispatch import TorchDispatchMode

from tformer.measure.flops import FORMULAS, counted_path


@dataclass
class Event:
    t: float
    what: str  # "begin" | "pre" | "post" | "end"
    module: str | None = None


@dataclass
class Segment:
    """The events of one phase of one step (forward or backward), in the order they happened."""

    phase: str  # "forward" | "backward"
    events: list[Event] = field(default_factory=list)
    flops: dict[int, int] = field(default_factory=dict)  # FLOPs counted after event i (before i+1)


class Timeline:
    """Collects hook events (and, in the FLOP pass, FLOPs) for one or more steps."""

    def __init__(self, sync=None):
        self.sync = sync or (lambda: None)
        self.segments: list[Segment] = []
        self.current: Segment | None = None

    def begin(self, phase: str) -> None:
        self.current = Segment(phase)
        self.segments.append(self.current)
        self.mark("begin")

    def end(self) -> None:
        self.mark("end")
        self.current = None

    def mark(self, what: str, module: str | None = None) -> None:
        if self.current is None:
            return
        self.sync()
        self.current.events.append(Event(time.perf_counter(), what, module))

    def add_flops(self, n: int) -> None:
        if self.current is not None and n:
            i = len(self.current.events) - 1
            self.current.flops[i] = self.current.flops.get(i, 0) + int(n)


class FlopRecorder(TorchDispatchMode):
    """Counts each aten op's FLOPs with FlopCounterMode's formulas into the timeline's current interval."""

    def __init__(self, timeline: Timeline):
        super().__init__()
        self.timeline = timeline
        self._path = None

    def __enter__(self):
        self._path = counted_path()
        self._path.__enter__()
        return super().__enter__()

    def __exit__(self, *exc):
        try:
            return super().__exit__(*exc)
        finally:
            self._path.__exit__(*exc)

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        out = func(*args, **kwargs)
        packet = func._overloadpacket
        if packet in FORMULAS:
            self.timeline.add_flops(FORMULAS[packet](*args, **kwargs, out_val=out))
        return out


class Hooks:
    """Forward (and backward) hooks on the modules named like ledger ops; remove() takes them off."""

    def __init__(self, model: torch.nn.Module, names: set[str], timeline: Timeline, backward: bool):
        self.handles = []
        self.hooked: set[str] = set()
        for name, module in model.named_modules():
            if name not in names:
                continue
            self.hooked.add(name)
            self.handles.append(module.register_forward_pre_hook(self._mark(timeline, "pre", name)))
            self.handles.append(module.register_forward_hook(self._mark(timeline, "post", name)))
            if backward:
                self.handles.append(module.register_full_backward_pre_hook(self._mark(timeline, "pre", name)))
                self.handles.append(module.register_full_backward_hook(self._mark(timeline, "post", name)))

    @staticmethod
    def _mark(timeline: Timeline, what: str, name: str):
        def hook(*_args):
            timeline.mark(what, name)

        return hook

    def remove(self) -> None:
        for h in self.handles:
            h.remove()
        self.handles = []


@dataclass
class Interval:
    """Seconds and FLOPs charged to a group of ledger ops (indices into the phase's op list)."""

    ops: tuple[int, ...]
    seconds: float
    flops: int


def attribute(segment: Segment, order: list, hooked: set[str]) -> list[Interval]:
    """Charge every interval between consecutive events to ledger ops.

    ``order``: the phase's ledger ops in execution order (forward: as built; backward: the ledger's
    backward list, which is already reversed). Inside a hooked module: that module's op. Between
    modules: the non-module ops between them in ``order``, else the op before (else the op after).
    """
    events = segment.events
    # Pass 1: the ledger index of every module event (a pre finds the next op of that name after
    # the cursor, so a module run twice (a shared embedding table) lines up with both of its rows).
    index: list[int | None] = [None] * len(events)
    cursor = -1
    open_pre: dict[str, list[int]] = {}
    for i, ev in enumerate(events):
        if ev.what == "pre":
            j = next((j for j in range(cursor + 1, len(order)) if order[j].name == ev.module), None)
            if j is None:
                j = next((j for j in range(len(order)) if order[j].name == ev.module), None)
            index[i] = j
            if j is not None:
                cursor = j
            open_pre.setdefault(ev.module, []).append(j)
        elif ev.what == "post":
            stack = open_pre.get(ev.module) or [None]
            index[i] = stack.pop() if stack else None
    out: list[Interval] = []
    inside: list[int] = []  # ledger indices of the modules we are inside (innermost last)
    last_module = -1  # ledger index of the last module that finished (or started)
    for i in range(len(events) - 1):
        ev, nxt = events[i], events[i + 1]
        if ev.what == "pre" and index[i] is not None:
            inside.append(index[i])
            last_module = index[i]
        elif ev.what == "post" and inside:
            inside.pop()
            if index[i] is not None:
                last_module = index[i]
        seconds = nxt.t - ev.t
        flops = segment.flops.get(i, 0)
        if inside:
            ops = (inside[-1],)
        else:
            following = index[i + 1] if nxt.what == "pre" and index[i + 1] is not None else len(order)
            between = tuple(j for j in range(last_module + 1, following) if order[j].name not in hooked)
            if between:
                ops = between
            elif last_module >= 0:
                ops = (last_module,)
            elif following < len(order):
                ops = (following,)
            else:
                continue
        out.append(Interval(ops, seconds, flops))
    return out


def merge(intervals: list[Interval]) -> dict[tuple[int, ...], tuple[float, int]]:
    """Sum seconds and FLOPs per group of ops. A group that is part of a larger one (an op reached
    both alone and with its neighbours) is folded into the larger group so each op has one row."""
    groups: dict[tuple[int, ...], list] = {}
    for iv in intervals:
        acc = groups.setdefault(iv.ops, [0.0, 0])
        acc[0] += iv.seconds
        acc[1] += iv.flops
    owner: dict[int, tuple[int, ...]] = {}
    for ops in sorted(groups, key=len, reverse=True):
        target = next((owner[j] for j in ops if j in owner), ops)
        for j in ops:
            owner.setdefault(j, target)
    out: dict[tuple[int, ...], list] = {}
    for ops, (s, f) in groups.items():
        target = owner[ops[0]]
        acc = out.setdefault(target, [0.0, 0])
        acc[0] += s
        acc[1] += f
    return {k: (v[0], v[1]) for k, v in out.items()}


def call_overhead(reps: int = 7, calls: int = 400) -> float:
    """Measured fixed cost of one small op call (seconds): a tiny nn.Linear forward, median of reps.

    Python module call, dispatcher and kernel launch with almost no arithmetic: what every op of
    the ledger pays on top of its FLOPs and bytes.
    """
    layer = torch.nn.Linear(8, 8)
    x = torch.randn(1, 8)
    with torch.no_grad():
        for _ in range(50):
            layer(x)
        times = []
        for _ in range(reps):
            t0 = time.perf_counter()
            for _ in range(calls):
                layer(x)
            times.append((time.perf_counter() - t0) / calls)
    return statistics.median(times)


__all__ = ["Event", "FlopRecorder", "Hooks", "Interval", "Segment", "Timeline", "attribute", "call_overhead", "merge"]
