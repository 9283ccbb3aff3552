"""Training and inference beyond one device: memory, traffic and time per device under data,
tensor and pipeline parallelism and ZeRO. Plain arithmetic over the architecture description and
the ledger; no torch.

A layout is N devices = D data-parallel replicas x T tensor-parallel ranks x P pipeline stages.
``Workload.batch`` is the batch of one replica (DeepSpeed's "micro batch per GPU" times the
micro-batches), so adding replicas never changes a device's activations; the global batch is D x batch.

Parameters per device, the largest stage: tformer.cost.placement (Megatron-LM tensor parallelism,
contiguous pipeline stages, FSDP2-style ZeRO shards).

Activations: what autograd keeps for one micro-batch (the ledger's saved bytes at batch / M), split
the way Korthikanti et al. 2022 split them: tensors inside the tensor-parallel region (Q, K, V,
scores, softmax, attention output, the MLP's hidden layer, the logits) by T; the rest (norm inputs,
residuals, the inputs of q/k/v and up) whole, or by T too with sequence parallelism. Under 1F1B a
stage s holds min(P - s, M) micro-batches in flight (GPipe: M).

Traffic per device and step (bytes sent, which a ring also receives):
- data parallel: ring all-reduce of the gradients, 2 (D - 1) / D x gradient bytes (ZeRO 0); ZeRO 1
  and 2 reduce-scatter the gradients and all-gather the updated weights, (D - 1) / D of each; ZeRO 3
  all-gathers the weights twice (forward and backward), 1.5x the plain volume in equal dtypes;
- tensor parallel: per attention or MLP block one all-reduce of the (rows, d) activations forward and
  one backward, 2 (T - 1) / T of their bytes each (with sequence parallelism an all-gather and a
  reduce-scatter instead: the same volume), plus the vocabulary-parallel embedding's forward all-reduce;
- pipeline: each boundary sends a micro-batch's (rows, d) activations forward and their gradient back
  (a boundary inside an encoder-decoder's decoder also carries the encoder's output, which the later
  layers' cross-attention reads).
Time: each device does 1 / (T x P) of a replica's step, stretched by the pipeline bubble
(P - 1) / (M + P - 1); communication is the bytes at the link's bandwidth in one direction plus, when
a per-collective latency is given, that latency once per collective call (the alpha-beta model):
DDP's gradient buckets (1 MiB first, then 25 MiB: PyTorch's defaults), one reduce-scatter and one or
two all-gathers per sharded unit (each layer, plus one for the rest of the model, as FSDP wraps it),
two all-reduces per block under tensor parallelism, two sends per micro-batch between stages.
"""

from __future__ import annotations

import math
from collections import Counter
from dataclasses import replace

from tformer.core.errors import TformerError
from tformer.cost.architecture import describe
from tformer.cost.layout import MAX_DEVICES, Layout, layer_count
from tformer.cost.ledger import ledger
from tformer.cost.memory import logits_bytes, optimizer_bytes_per_param
from tformer.cost.oplist import stack_tokens
from tformer.cost.placement import (
    PlacedTensor,
    layer_spans,
    placed_tensors,
    stage_finder,
    stage_layers,
    stage_tensors,
)
from tformer.cost.workload import ACTIVATION_BYTES, WEIGHT_BYTES

# PyTorch DDP: the first bucket after the buckets are rebuilt holds 1 MiB, the others bucket_cap_mb=25 MiB.
DDP_FIRST_BUCKET_BYTES = 1 << 20
DDP_BUCKET_BYTES = 25 << 20
MAX_TP = 8  # tensor parallelism stays inside one node (8 GPUs with NVLink) in the devices-needed search

# Ops whose saved tensors live inside the tensor-parallel region (split by T); the rest are whole
# on each rank unless sequence parallelism splits them along the sequence.
_TP_SPLIT_KINDS = {"scores", "softmax", "context", "out_proj", "activation", "ffn_down", "lm_head", "loss"}


def zero_model_state_bytes(params: float, devices: int, stage: int, weight_bytes: float = 2,
                           grad_bytes: float = 2, optimizer_bytes: float = 12) -> float:
    """The ZeRO paper's per-device model states, (2 + 2 + K) x params with K = 12 for mixed-precision
    Adam, partitioned by stage: 1 the K part, 2 the gradients too, 3 everything."""
    if stage not in (0, 1, 2, 3):
        raise TformerError(f"ZeRO stage {stage} does not exist; choose 0, 1, 2 or 3")
    w = weight_bytes / (devices if stage >= 3 else 1)
    g = grad_bytes / (devices if stage >= 2 else 1)
    k = optimizer_bytes / (devices if stage >= 1 else 1)
    return params * (w + g + k)


def ring_all_reduce_bytes(nbytes: float, devices: int) -> float:
    """Bytes each device sends in a ring all-reduce of ``nbytes``: a reduce-scatter then an all-gather,
    each (N - 1) / N of the buffer (it receives as many)."""
    return 2 * (devices - 1) / devices * nbytes


def ring_all_reduce_steps(devices: int) -> int:
    """Communication steps of a ring all-reduce: N - 1 for the reduce-scatter, N - 1 for the all-gather."""
    return 2 * (devices - 1)


def data_parallel_efficiency(step_s: float, devices: int, comm_s: float) -> float:
    """Strong scaling: a fixed batch whose one-device step takes ``step_s`` split over ``devices``, plus an
    all-reduce of ``comm_s`` not overlapped: (T / N) / (T / N + T_comm)."""
    return (step_s / devices) / (step_s / devices + comm_s)


def devices_for(nbytes: float, device_bytes: float) -> int:
    """Devices needed to hold ``nbytes`` when it divides evenly: ceil(bytes / memory per device)."""
    return math.ceil(nbytes / device_bytes)


# Activations per device --------------------------------------------------------------------------
class Plans:
    """Caches what a layout search asks for many times: the ledger at each micro-batch size, the
    tensors per stage at each (T, P) and what rank 0 holds of them at each shard count, the
    activations per layer at each (T, SP, M) and per stage at each (T, P, M, SP). One Plans serves
    every layout of one (config, workload): pass it to per_device, communication, devices_needed."""

    def __init__(self, config, workload):
        self.config, self.workload = config, workload
        self.arch = describe(config)
        self.softcap = bool(getattr(self.arch.lm_head, "softcap", False))  # a chunked loss's working set (logits_bytes)
        self.spans = layer_spans(self.arch)
        self.all_tensors = placed_tensors(self.arch)
        self.n_layers = layer_count(config)
        self._ledgers, self._tensors, self._acts = {}, {}, {}
        self._shape_counts, self._elements, self._largest, self._anchors = {}, {}, {}, {}

    def ledger(self, batch: int):
        if batch not in self._ledgers:
            self._ledgers[batch] = ledger(self.config, replace(self.workload, batch=batch))
        return self._ledgers[batch]

    def tensors(self, tp: int, pp: int) -> list[list[tuple[PlacedTensor, tuple[int, ...]]]]:
        if (tp, pp) not in self._tensors:
            self._tensors[tp, pp] = stage_tensors(self.config, tp, pp, self.arch, self.all_tensors)
        return self._tensors[tp, pp]

    def elements(self, tp: int, pp: int, shards: int, trained: bool = False) -> list[int]:
        """Per stage, placement.sharded_elements of its shapes: what rank 0 of ``shards`` holds (``trained``: only
        the tensors the loss reaches, which alone have gradients and optimizer state). A search asks
        this for many shard counts, and a stage repeats one layer's shapes, so each distinct
        (rows, rest of the shape) is counted once and multiplied."""
        key = (tp, pp, shards, trained)
        if key not in self._elements:
            if (tp, pp, trained) not in self._shape_counts:
                skips = self.arch.loss_skips if trained else ()
                self._shape_counts[tp, pp, trained] = [
                    # shape (): a scalar (CLIP's temperature), one row of one element
                    Counter((shape[0] if shape else 1, math.prod(shape[1:])) for t, shape in st
                            if not (skips and t.name.startswith(skips)))
                    for st in self.tensors(tp, pp)]
            self._elements[key] = [sum(n * -(-rows // shards) * rest for (rows, rest), n in counts.items())
                                   for counts in self._shape_counts[tp, pp, trained]]
        return self._elements[key]

    def largest_layer(self, tp: int, pp: int) -> list[int]:
        """Per stage, the elements of its largest layer (what ZeRO-3 gathers whole while it runs)."""
        if (tp, pp) not in self._largest:
            sizes = []
            for st in self.tensors(tp, pp):
                layers: dict[int, int] = {}
                for t, shape in st:
                    if t.in_layer:
                        layers[t.anchor] = layers.get(t.anchor, 0) + math.prod(shape)
                sizes.append(max(layers.values(), default=0))
            self._largest[tp, pp] = sizes
        return self._largest[tp, pp]

    def boundary_tokens(self, pp: int) -> list[int]:
        """Per boundary between pipeline stages, the tokens per sequence whose (tokens, d) hidden states
        cross it: the sending stack's, plus the encoder's output when a decoder layer sends (the later
        decoder layers' cross-attention reads it). A stack that does not run (the encoder in a decode
        step) sends nothing."""
        in_order = [st for st in self.arch.stacks for _ in st.layers]
        encoder = next((st for st in self.arch.stacks if not st.causal), None)
        memory = stack_tokens(encoder, self.workload) if encoder is not None else None
        out = []
        for r in stage_layers(self.n_layers, pp)[:-1]:
            sender = in_order[r.stop - 1]
            own = stack_tokens(sender, self.workload)
            out.append((own.tq if own else 0) + (memory.tq if sender.cross and memory else 0))
        return out

    def blocks(self, pp: int) -> list[int]:
        """Per stage, its attention and MLP blocks (each ends in one tensor-parallel all-reduce)."""
        per_layer = [len(layer.attention) + 1 for st in self.arch.stacks for layer in st.layers]
        return [sum(per_layer[i] for i in r) for r in stage_layers(self.n_layers, pp)]

    def activations(self, layout: Layout) -> list[dict]:
        key = (layout.tp, layout.pp, layout.micro_batches, layout.sequence_parallel)
        if key not in self._acts:
            self._acts[key] = self._activations(layout)
        return self._acts[key]

    def _anchor(self, op) -> int | None:
        """The layer ``op`` runs with, as placed_tensors places the tensors: its own; a stack's embeddings with
        its first layer, its final norm with its last; None for the heads and the loss."""
        if op.layer is not None:
            return self.spans[op.stack][op.layer]
        if op.stack and (op.kind in ("embedding", "position") or op.name.endswith(".embed_norm")):
            return self.spans[op.stack].start
        if op.stack and op.name.endswith(".final_norm"):
            return self.spans[op.stack][-1]
        return None

    def _per_anchor(self, tp: int, sp: bool, micro: int) -> dict:
        """Per layer anchor (None: the heads), for one micro-batch of ``micro`` sequences: activation bytes
        kept (training; ``outside_layers`` the part no layer owns, ``layer_kept`` the part its layer
        owns) or the largest working set (inference), the layer's input, KV cache and logits. Stages
        are sums of anchors, so a search over pipeline depths reads the ledger once per (T, SP, M)."""
        key = (tp, sp, micro)
        if key in self._anchors:
            return self._anchors[key]
        training = self.workload.training
        per: dict = {}
        for op in self.ledger(micro).select(phase="forward"):
            split = tp if (op.kind in _TP_SPLIT_KINDS or sp) else 1
            anchor = self._anchor(op)
            a = per.setdefault(anchor, {"activations": 0, "outside_layers": 0, "layer_inputs": 0, "layer_kept": 0,
                                        "kv_cache": 0, "logits": 0, "input_seen": False})
            a["kv_cache"] += op.cache_bytes // tp  # K and V heads are split by T
            if op.kind == "lm_head" or op.name == "mlm_head.decoder":
                a["logits"] += -(-logits_bytes(op, self.workload, self.softcap) // tp)
            if not training:
                working = op.bytes_read - op.weight_bytes - op.cache_bytes + op.bytes_written
                a["activations"] = max(a["activations"], -(-working // split))
                continue
            kept = -(-op.saved_bytes // split)
            a["activations"] += kept
            if op.layer is None:
                a["outside_layers"] += kept
            else:
                # A layer's input is the size of its first norm's output (rows x d, pre- or post-LN alike).
                if op.kind == "norm" and not a["input_seen"]:
                    a["input_seen"] = True
                    a["layer_inputs"] += -(-op.bytes_written // (tp if sp else 1))
                a["layer_kept"] += kept
        self._anchors[key] = per
        return per

    def _activations(self, layout: Layout) -> list[dict]:
        """Per stage, for one micro-batch: activation bytes kept (training; ``outside_layers`` the part no
        layer owns) or the largest working set (inference), each layer's input, the largest layer's kept
        bytes, KV cache and logits."""
        per = self._per_anchor(layout.tp, layout.sequence_parallel, self.workload.batch // layout.micro_batches)
        stage_of = stage_finder(stage_layers(self.n_layers, layout.pp))
        stages = [{"activations": 0, "outside_layers": 0, "layer_inputs": 0, "largest_layer": 0, "kv_cache": 0,
                   "logits": 0} for _ in range(layout.pp)]
        for anchor, a in per.items():
            st = stages[stage_of(anchor)]
            if self.workload.training:
                st["activations"] += a["activations"]
            else:
                st["activations"] = max(st["activations"], a["activations"])
            for k in ("outside_layers", "layer_inputs", "kv_cache", "logits"):
                st[k] += a[k]
            st["largest_layer"] = max(st["largest_layer"], a["layer_kept"])
        return stages


def in_flight(layout: Layout, stage: int) -> int:
    """Micro-batches whose activations stage ``stage`` holds at its peak (1F1B: P - s, at most M)."""
    if layout.schedule == "gpipe":
        return layout.micro_batches
    return min(layout.pp - stage, layout.micro_batches)


def bubble_fraction(pp: int, micro_batches: int) -> float:
    """Idle share of a GPipe or 1F1B pipeline step: (P - 1) / (M + P - 1)."""
    return (pp - 1) / (micro_batches + pp - 1)


# The whole picture --------------------------------------------------------------------------------
def per_device(config, workload, layout: Layout, plans: Plans | None = None) -> dict:
    """Memory per device on the fullest stage: weights, gradients, optimizer, activations, logits,
    KV cache and total, plus what FSDP2 holds beside them (``kept_shard``: shard_grad_op's own shard
    when there is no master copy; ``gathered_layer``: the layer ZeRO-3 gathers whole while it runs);
    ``stages`` lists every stage."""
    layout.check(config, workload)
    plans = plans or Plans(config, workload)
    per = optimizer_bytes_per_param(workload)
    acts = plans.activations(layout)
    d, z = layout.dp, layout.zero
    rows = []
    t, p = layout.tp, layout.pp

    def held(shards: int, stage: int, trained: bool = False) -> int:
        return plans.elements(t, p, shards, trained)[stage]

    for s in range(p):
        whole = held(1, s)
        a = acts[s]
        kept_shard = gathered = 0
        if workload.training:
            weights = held(d if z >= 3 else 1, s) * per["weights"]
            if z == 2 and d > 1 and not per["master"]:
                # FSDP2's shard_grad_op gathers whole weights for forward and backward and keeps its own
                # shard beside them; with a master copy that shard is the master, counted in the optimizer.
                kept_shard = held(d, s) * per["weights"]
            if z == 3 and d > 1:  # one layer's weights gathered whole while it runs (transient)
                gathered = plans.largest_layer(layout.tp, layout.pp)[s] * per["weights"]
            gradients = held(d if z >= 2 else 1, s, trained=True) * per["gradients"]
            optimizer = held(d if z >= 1 else 1, s, trained=True) * (per["master"] + per["moments"])
            n = in_flight(layout, s)
            if workload.checkpointing:  # per micro-batch in flight each layer's input (and what no layer
                # recomputes: embeddings, head, loss); one layer rebuilt at a time
                activations = (a["layer_inputs"] + a["outside_layers"]) * n + a["largest_layer"]
            else:
                activations = a["activations"] * n
            logits = a["logits"] * n
            kv = 0
        else:
            weights = whole * per["weights"]
            gradients = optimizer = 0
            activations, logits, kv = a["activations"], a["logits"], a["kv_cache"]
        total = weights + kept_shard + gathered + gradients + optimizer + activations + logits + kv
        rows.append({"stage": s, "params": whole, "weights": weights, "kept_shard": kept_shard,
                     "gathered_layer": gathered, "gradients": gradients, "optimizer": optimizer,
                     "activations": activations, "logits": logits, "kv_cache": kv, "total": total})
    worst = max(rows, key=lambda r: r["total"])
    return {**worst, "stages": rows}


def ddp_buckets(gradient_bytes: int) -> int:
    """All-reduce calls per step for DDP's gradient buckets (sizes as PyTorch's defaults)."""
    rest = max(0, gradient_bytes - DDP_FIRST_BUCKET_BYTES)
    return 1 + math.ceil(rest / DDP_BUCKET_BYTES)


def communication(config, workload, layout: Layout, link_bandwidth: float | None = None,
                  plans: Plans | None = None, link_latency: float | None = None) -> dict:
    """Bytes each device sends per step and the collective calls that send them, by kind, and the
    seconds at ``link_bandwidth`` (bytes/s, one way) plus ``link_latency`` (seconds) per call."""
    layout.check(config, workload)
    plans = plans or Plans(config, workload)
    per = optimizer_bytes_per_param(workload) if workload.training else {"weights": WEIGHT_BYTES[workload.dtype]}
    a = ACTIVATION_BYTES[workload.dtype]
    d, t, p, m = layout.dp, layout.tp, layout.pp, layout.micro_batches
    trained = max(plans.elements(t, p, 1, trained=True))
    blocks = max(plans.blocks(p))
    micro = workload.batch // m
    rows_per_micro = micro * _tokens_per_sequence(config, workload)
    act = rows_per_micro * config.d_model * a
    kinds: dict[str, int] = {}
    calls: dict[str, int] = {}
    if workload.training and d > 1:
        if layout.zero == 0:
            kinds["data_parallel_all_reduce"] = round(ring_all_reduce_bytes(trained * per["gradients"], d))
            calls["data_parallel_all_reduce"] = ddp_buckets(trained * per["gradients"])
        else:
            # Sharded collectives carry every rank's padded piece (FSDP2: ceil(rows / D) rows of each
            # tensor), so a rank sends D - 1 pieces the size of rank 0's, not (D - 1) / D of the parameters.
            piece, trained_piece = max(plans.elements(t, p, d)), max(plans.elements(t, p, d, trained=True))
            # FSDP units: one per layer, one for the rest (tables, final norm, heads)
            units = max(len(r) for r in stage_layers(plans.n_layers, p)) + 1
            kinds["zero_reduce_scatter"] = (d - 1) * trained_piece * per["gradients"]
            calls["zero_reduce_scatter"] = units
            gathers = 2 if layout.zero == 3 else 1
            kinds["zero_all_gather"] = gathers * (d - 1) * piece * per["weights"]
            calls["zero_all_gather"] = gathers * units
    if t > 1:
        passes = 2 if workload.training else 1  # one all-reduce forward, one backward per block
        embed = 1  # the vocabulary-parallel embedding's forward all-reduce (first stage)
        kinds["tensor_parallel_all_reduce"] = round(ring_all_reduce_bytes(act * m * (blocks * passes + embed), t))
        calls["tensor_parallel_all_reduce"] = m * (blocks * passes + embed)
    crossing = max(plans.boundary_tokens(p)) if p > 1 else 0
    if crossing:
        directions = 2 if workload.training else 1  # activations forward, their gradients back
        kinds["pipeline_send"] = micro * crossing * config.d_model * a * m * directions
        calls["pipeline_send"] = m * directions
    total = sum(kinds.values())
    seconds = None
    if link_bandwidth:
        seconds = total / link_bandwidth + sum(calls.values()) * (link_latency or 0.0)
    return {"bytes": kinds, "total_bytes": total, "calls": calls, "link_bandwidth": link_bandwidth,
            "link_latency": link_latency, "seconds": seconds,
            "rule": "bytes each device sends per step (a ring receives as many); seconds = bytes / link bandwidth "
                    "+ calls x link latency"}


def _tokens_per_sequence(config, workload) -> int:
    if workload.phase == "decode":
        return 1
    return max(workload.seq, workload.seq_decoder or 0)


def step_time(single_device_s: float | None, comm_s: float | None, layout: Layout) -> dict:
    """Compute per device (a replica's step over T x P, stretched by the bubble) and communication,
    overlapped (max) and not (sum)."""
    if single_device_s is None:
        return {"compute_s": None, "communication_s": comm_s, "overlapped_s": None, "serial_s": None}
    bubble = bubble_fraction(layout.pp, layout.micro_batches)
    compute = single_device_s / (layout.tp * layout.pp) / (1 - bubble)
    c = comm_s or 0.0
    return {"compute_s": compute, "communication_s": comm_s, "overlapped_s": max(compute, c),
            "serial_s": compute + c, "bubble_fraction": bubble}


def parallel_summary(config, workload, layout: Layout, link_bandwidth: float | None = None,
                     single_device_s: float | None = None, device_memory: int | None = None,
                     link_latency: float | None = None) -> dict:
    """Everything about a layout under the JSON names `tformer count` prints: ``per_device`` (memory),
    ``communication``, ``pipeline``, ``time``, and ``devices_needed`` when a device's memory is given."""
    plans = Plans(config, workload)
    mem = per_device(config, workload, layout, plans)
    comm = communication(config, workload, layout, link_bandwidth, plans, link_latency)
    out = {
        "layout": {"devices": layout.devices, "data_parallel": layout.dp, "tensor_parallel": layout.tp,
                   "pipeline_parallel": layout.pp, "micro_batches": layout.micro_batches, "zero": layout.zero,
                   "sequence_parallel": layout.sequence_parallel, "schedule": layout.schedule,
                   "global_batch": workload.batch * layout.dp, "text": layout.describe()},
        "per_device": mem,
        "communication": comm,
        "pipeline": {"stages": layout.pp, "micro_batches": layout.micro_batches,
                     "bubble_fraction": bubble_fraction(layout.pp, layout.micro_batches)},
        "time": step_time(single_device_s, comm["seconds"], layout),
    }
    if device_memory:
        out["devices_needed"] = devices_needed(config, workload, device_memory, zero=layout.zero,
                                               micro_batches=layout.micro_batches,
                                               sequence_parallel=layout.sequence_parallel, plans=plans)
    return out


def devices_needed(config, workload, memory_bytes: int, zero: int = 0, micro_batches: int = 1,
                   sequence_parallel: bool = False, max_tp: int = MAX_TP, plans: Plans | None = None) -> dict:
    """The fewest devices of ``memory_bytes`` each that hold the workload, and the layout that does it.

    Training: ZeRO stage ``zero`` over the replicas (more replicas shard more with stages 1-3),
    tensor parallelism up to ``max_tp`` (one node), pipeline stages up to the layer count. Inference:
    weights, KV cache and working set split by tensor and pipeline parallelism. Ties go to the layout
    that sends the fewest bytes per device.
    """
    if not memory_bytes or memory_bytes <= 0:
        raise TformerError("devices needed: the device's memory is unknown; name a device with a memory size "
                           "(--hardware h100-sxm) or give a JSON device with memory_bytes")
    best = None
    plans = plans or Plans(config, workload)
    layers = layer_count(config)
    for tp in (t for t in range(1, max_tp + 1) if not (config.n_heads % t or config.n_kv_heads % t or config.d_ff % t)):
        for pp in range(1, layers + 1):
            m = micro_batches if pp > 1 else 1  # micro-batches only matter to a pipeline
            if workload.batch % m:
                continue
            sp = sequence_parallel and tp > 1
            base = Layout(tp * pp, zero if workload.training else 0, tp, pp, m, sp)
            if best is not None and base.devices > best[0].devices:
                break  # more stages only add devices
            fits = _smallest_dp(config, workload, base, memory_bytes, plans)
            if fits is None:
                continue
            layout, total = fits
            key = (layout.devices, communication(config, workload, layout, plans=plans)["total_bytes"])
            if best is None or key < best[2]:
                best = (layout, total, key)
    if best is None:
        return {"devices": None, "layout": None, "per_device_total": None, "memory_bytes": memory_bytes,
                "reason": f"no layout with tensor parallelism up to {max_tp} and up to {layers} pipeline stages fits: "
                          "a device's share of activations stays too large (try --checkpointing, a smaller --batch, "
                          "more --micro-batches or --sequence-parallel)"}
    layout, total, _ = best
    return {"devices": layout.devices, "layout": layout.describe(), "data_parallel": layout.dp,
            "tensor_parallel": layout.tp, "pipeline_parallel": layout.pp, "zero": layout.zero,
            "per_device_total": total, "memory_bytes": memory_bytes}


def _smallest_dp(config, workload, base: Layout, memory_bytes: int, plans: Plans):
    """(layout, per-device total) with the fewest replicas that fits, or None. Replicas shrink the
    model states only under ZeRO, so without it one replica is the only candidate."""
    def total(dp: int) -> int:
        return per_device(config, workload, replace(base, devices=base.tp * base.pp * dp), plans)["total"]

    one = total(1)
    if one <= memory_bytes:
        return base, one
    if not workload.training or base.zero == 0:
        return None
    cap = MAX_DEVICES // (base.tp * base.pp)
    if total(cap) > memory_bytes:
        return None
    lo, hi = 2, cap
    # From 2 replicas on, per-device memory never grows with more of them (at 2, ZeRO adds what FSDP2
    # holds beside the shards: shard_grad_op's own shard, ZeRO-3's gathered layer): the smallest that fits.
    while lo < hi:
        mid = (lo + hi) // 2
        if total(mid) <= memory_bytes:
            hi = mid
        else:
            lo = mid + 1
    layout = replace(base, devices=base.tp * base.pp * lo)
    return layout, total(lo)
