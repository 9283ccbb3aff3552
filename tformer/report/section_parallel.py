"""Section 7: beyond one device — what each device holds as the model spreads over more of them (ZeRO
stages 0-3, tensor parallelism), how many named GPUs the model needs, what communication costs beside
compute, and a real 2-process run (DDP, FSDP2) measured beside the ledger's prediction.

Every figure is tformer.cost.parallel's, for the report's training workload; the measured run is
tformer.train.parallel_check's (the same as bench/distributed.py)."""

from __future__ import annotations

from dataclasses import replace

from tformer.core import fmt
from tformer.core.config import preset
from tformer.core.errors import TformerError
from tformer.cost.layout import Layout
from tformer.cost.ledger import ledger
from tformer.cost.parallel import Plans, devices_needed, parallel_summary, per_device
from tformer.cost.roofline import roofline
from tformer.machine import resolve_hardware
from tformer.machine.links import link_bandwidth
from tformer.report import plots
from tformer.report.doc import Section
from tformer.train.parallel_check import compare, timing

DEVICE_COUNTS = (1, 2, 4, 8, 16, 32, 64)
TP_DEGREES = (1, 2, 4, 8)
GPUS = ("h100-sxm", "a100-40gb-sxm", "rtx-4090", "t4")
FOR_SCALE = "llama-70b"  # the devices-needed question where it is not trivially "one"
CAPACITY_LINE_SPAN = 4  # draw the device's memory in the plot only within 4x of the largest curve


def _valid(config, workload, layout: Layout) -> bool:
    try:
        layout.check(config, workload)
    except TformerError:
        return False
    return True


def memory_series(config, workload) -> dict[str, list[tuple[int, int]]]:
    """Per-device training memory (bytes) against the device count: ZeRO 0-3 over data-parallel
    replicas, and tensor parallelism (one replica) with and without sequence parallelism."""
    plans = Plans(config, workload)
    series = {f"ZeRO-{z} (data parallel)": [(n, per_device(config, workload, Layout(n, z), plans)["total"])
                                            for n in DEVICE_COUNTS] for z in range(4)}
    for sp in (False, True):
        pts = [(t, per_device(config, workload, Layout(t, 0, tp=t, sequence_parallel=sp and t > 1), plans)["total"])
               for t in TP_DEGREES if _valid(config, workload, Layout(t, 0, tp=t))]
        if len(pts) > 1:
            series["tensor parallel" + (" + sequence parallel" if sp else "")] = pts
    return series


def _needed_cell(need: dict) -> str:
    if need["devices"] is None:
        return "does not fit"
    return f"**{need['devices']}** ({need['layout'].split(': ', 1)[1]})"


def needed_rows(config, train, infer) -> tuple[list[list[str]], dict]:
    """Devices needed on each GPU in GPUS: training as the report trains, training in bf16 with an
    fp32 master copy under ZeRO-3, and bf16 inference."""
    columns = {"train_fp32": (train, 0), "train_bf16_zero3": (replace(train, dtype="bf16", mixed_precision=True), 3)}
    if infer is not None:
        columns["inference_bf16"] = (replace(infer, dtype="bf16"), 0)
    plans = {key: Plans(config, w) for key, (w, _) in columns.items()}  # one search cache per workload
    rows, data = [], {}
    for name in GPUS:
        gpu = resolve_hardware(name)
        cells = {key: devices_needed(config, w, gpu.memory_bytes, zero=zero, plans=plans[key])
                 for key, (w, zero) in columns.items()}
        data[name] = cells
        rows.append([f"{name} ({fmt.gib(gpu.memory_bytes)})"] + [_needed_cell(c) for c in cells.values()])
    return rows, data


def comm_layouts(config, workload) -> list[Layout]:
    """A few layouts on up to 8 devices that this model and batch allow."""
    candidates = [Layout(2), Layout(8), Layout(8, 3), Layout(2, 0, tp=2), Layout(8, 0, tp=8),
                  Layout(2, 0, pp=2, micro_batches=4)]
    return [c for c in candidates if _valid(config, workload, c)]


def comm_rows(config, workload, single_s: float | None, bandwidth: float,
              latency: float | None) -> tuple[list[list[str]], list[dict]]:
    rows, data = [], []
    for layout in comm_layouts(config, workload):
        s = parallel_summary(config, workload, layout, bandwidth, single_s, link_latency=latency)
        t, comm = s["time"], s["communication"]
        # Throughput against one device: D replicas each finish a step of the per-replica batch.
        speedup = layout.dp * single_s / t["overlapped_s"] if single_s and t["overlapped_s"] else None
        rows.append([layout.describe(), fmt.gib(comm["total_bytes"]), fmt.seconds(comm["seconds"]),
                     fmt.seconds(t["compute_s"]), fmt.seconds(t["overlapped_s"]), fmt.seconds(t["serial_s"]),
                     f"{speedup:.2f}x ({fmt.pct(speedup / layout.devices, 0)})" if speedup else "unknown"])
        data.append({"layout": s["layout"], "communication": comm, "time": t, "speedup": speedup})
    return rows, data


def build(ctx) -> Section:
    sec = Section(7, "Beyond one device", "parallel")
    data: dict = {}
    _memory(sec, ctx, data)
    _devices_needed(sec, ctx, data)
    _communication(sec, ctx, data)
    _measured(sec, ctx, data)
    ctx.data["parallel"] = data
    return sec


def _memory(sec: Section, ctx, data: dict) -> None:
    """Memory per device against the device count (plot and table), and what each part is at 8 devices."""
    config, w, capacity = ctx.config, ctx.workloads["train"], ctx.target_memory
    series = memory_series(config, w)
    sec.text(f"Training {w.batch} x {w.seq} tokens per replica in fp32 with AdamW (4 B weights + 4 B gradients + "
             "8 B moments per parameter; the ZeRO paper's mixed-precision K = 12 is `tformer count --dtype bf16 "
             "--mixed-precision`). ZeRO-1 shards the optimizer state over the data-parallel replicas, ZeRO-2 the "
             "gradients too, ZeRO-3 the weights too; none of them shards activations, so the curves flatten at one "
             "replica's activations. Tensor parallelism splits each layer's matrices (and their activations, "
             "except the layer norms' and dropouts' inputs, which only sequence parallelism splits).")
    top = max(b for pts in series.values() for _, b in pts)
    far = capacity and capacity > CAPACITY_LINE_SPAN * top  # a line that far up would flatten the curves
    sec.figure("parallel_memory", plots.memory_per_device(
        series, None if far else capacity, f"{ctx.target.name} memory ({fmt.gib(capacity)})" if capacity else "",
        "Memory per device vs device count"),
        "Training memory per device against the device count (ledger, tformer.cost.parallel)"
        + (f"; {ctx.target.name}'s {fmt.gib(capacity)} is far above every curve" if far else "") + ".")
    counts = sorted({n for pts in series.values() for n, _ in pts})
    table = [[label] + [fmt.gib(dict(pts)[n]) if n in dict(pts) else "-" for n in counts]
             for label, pts in series.items()]
    sec.table(["layout"] + [f"{n} device{'s' if n > 1 else ''}" for n in counts], table,
              caption="Training memory per device (GiB = 2^30 B); '-': the heads or FFN do not split that many ways")
    at = 8
    parts = [("ZeRO-0 (DDP)", Layout(at, 0)), ("ZeRO-1", Layout(at, 1)), ("ZeRO-2", Layout(at, 2)),
             ("ZeRO-3", Layout(at, 3)), ("tensor parallel", Layout(at, 0, tp=at))]
    split = [(name, per_device(config, w, layout)) for name, layout in parts if _valid(config, w, layout)]
    sec.table([f"on {at} devices", "weights", "gradients", "optimizer", "activations", "total"],
              [[name, fmt.gib(m["weights"] + m["kept_shard"] + m["gathered_layer"]), fmt.gib(m["gradients"]),
                fmt.gib(m["optimizer"]), fmt.gib(m["activations"] + m["logits"]), fmt.gib(m["total"])]
               for name, m in split],
              caption=f"What each device holds on {at} devices (weights include ZeRO-3's gathered layer and "
                      "ZeRO-2's kept fp32 shard; activations include the logits)")
    data["memory_vs_devices"] = {k: [{"devices": n, "bytes": b} for n, b in v] for k, v in series.items()}


def _devices_needed(sec: Section, ctx, data: dict) -> None:
    """The fewest of each named GPU for this model, then for FOR_SCALE on the same batch."""
    w = ctx.workloads["train"]
    infer = ctx.workloads.get("decode") or ctx.workloads.get("forward")
    rows, need = needed_rows(ctx.config, w, infer)
    heads = ["GPU", "training (fp32 AdamW, as above)", "training (bf16 + fp32 master, ZeRO-3)"]
    if infer is not None:
        heads.append(f"inference (bf16, {infer.phase}, batch {infer.batch})")
    sec.table(heads, rows, caption="Devices needed: the fewest of each GPU that hold the step, and the layout "
                                   "(tensor parallelism up to 8 in a node, pipeline stages up to the layer count)")
    big = preset(FOR_SCALE)
    big_train = replace(w, seq=min(w.seq, big.max_positions))
    big_infer = infer
    if infer is not None and infer.phase == "decode":
        big_infer = replace(infer, context=min(infer.context, big.max_positions - 1))
    big_rows, big_need = needed_rows(big, big_train, big_infer)
    sec.table([h.replace("as above", "same batch") for h in heads], big_rows,
              caption=f"For scale: the preset {FOR_SCALE} ({fmt.params(ledger(big, big_train).params['total'])} "
                      f"parameters) on the same batch (`tformer count --preset {FOR_SCALE} --phase train --zero 3 "
                      "--hardware NAME ...` gives each cell)")
    data["devices_needed"] = {"model": need, FOR_SCALE: big_need}


def _communication(sec: Section, ctx, data: dict) -> None:
    """Communication vs compute per step for a few layouts, over the target's link (else the measured loopback)."""
    config, w = ctx.config, ctx.workloads["train"]
    bw, source = link_bandwidth(None, ctx.target)
    latency = None  # the spec table gives bandwidths only
    probe = ctx.results.get("distributed")
    if bw is None and isinstance(probe, dict):
        bw, latency = probe["loopback"]["bus_bytes_per_s"], probe["loopback"]["latency_s"]
        source = (f"this machine's gloo loopback all-reduce, measured below, and {fmt.seconds(latency)} per "
                  "collective call")
    pred = roofline(ctx.ledgers["train"], ctx.target).time_s
    single_s = pred if isinstance(pred, float) else None
    if bw is None:
        sec.text("Communication vs compute: the link between devices is unknown here; name a GPU with `--hardware` "
                 "(its NVLink or PCIe link is in the spec table) to see it.")
        return
    rows, comm = comm_rows(config, w, single_s, bw, latency)
    sec.table(["layout", "sent per device per step", "communication", "compute per device", "step (overlapped)",
               "step (not overlapped)", "throughput vs 1 device"], rows,
              caption=f"Communication vs compute per training step on {ctx.target.name}: link {fmt.bandwidth(bw)} "
                      f"one way ({source}); compute is the roofline's predicted step split over the tensor and "
                      "pipeline ranks (and stretched by the pipeline bubble)")
    sec.text("Data parallelism sends every gradient once per step (a ring all-reduce: 2 (N - 1) / N of them) "
             "whatever the batch, so a larger batch per replica hides it behind more compute; ZeRO-3 adds two "
             "all-gathers of the weights (1.5x the bytes); tensor parallelism sends activations, two all-reduces "
             "per layer each way, which grow with the batch and never hide.")
    data["communication_vs_compute"] = {"link_bandwidth": bw, "link_latency": latency, "link_source": source,
                                        "single_device_s": single_s, "layouts": comm}


def _measured(sec: Section, ctx, data: dict) -> None:
    """The measured 2-process run beside the ledger: bytes and calls, then step times."""
    probe = ctx.results.get("distributed")
    if not isinstance(probe, dict):
        sec.text(f"No measured multi-process run: {ctx.results.get('distributed_skip_reason', 'not run')}.")
        return
    n = probe["world"]
    rows, times = compare(ctx.config, probe), timing(ctx.config, probe)
    sec.text(f"Measured here: `torchrun` with {n} CPU processes over gloo (one thread each), {probe['batch']} x "
             f"{probe['seq']} tokens per replica, fp32 AdamW, for DDP (ZeRO-0), FSDP2 `full_shard` (ZeRO-3) and "
             "`shard_grad_op` (ZeRO-2). The bytes rank 0 holds are summed over its local shards; the bytes it sends "
             "are counted by a DDP communication hook and on FSDP2's collectives.")
    sec.table(["layout", "kind", "measured (rank 0)", "predicted (ledger)", "measured / predicted",
               "collective calls (measured / ledger)"],
              [[r["layout"], r["kind"], f"{r['measured']:,} B", f"{r['predicted']:,} B",
                f"{r['ratio']:.3f}" if r["ratio"] is not None else "-",
                f"{r['calls']} / {r['predicted_calls']}" if "calls" in r else ""] for r in rows],
              caption=f"Bytes per device, rank 0 of {n}: measured beside the ledger")
    lb = probe["loopback"]
    sec.table(["layout", "measured step", "predicted (overlapped)", "predicted (not overlapped)",
               "efficiency measured", "predicted (overlapped)", "predicted (not overlapped)"],
              [[t["layout"], fmt.seconds(t["measured_s"]), fmt.seconds(t["overlapped_s"]), fmt.seconds(t["serial_s"]),
                fmt.pct(t["efficiency"], 0), fmt.pct(t["efficiency_overlapped"], 0),
                fmt.pct(t["efficiency_serial"], 0)] for t in times],
              caption=f"Step time: one process alone {fmt.seconds(probe['single']['step_s'])} "
                      "(same batch per replica); "
                      "prediction = that step and the ledger's traffic over the measured loopback link (bus bandwidth "
                      f"{fmt.bandwidth(lb['bus_bytes_per_s'])}, {fmt.seconds(lb['latency_s'])} per collective call); "
                      f"efficiency = single step / {n}-process step")
    sec.text("The bytes are exact; the time is a model. What it leaves out shows most on small models: FSDP2's "
             "per-parameter work (DTensor dispatch, copying shards into and out of the flat all-gather buffers, "
             "the optimizer stepping each shard) costs about the same whatever the layer's size, and gloo's "
             "collectives reach the large-message bandwidth only at megabytes (docs/PREDICTION.md, "
             "\"Beyond one device\", has the profile).")
    data["measured"] = {"world": n, "batch": probe["batch"], "seq": probe["seq"], "bytes": rows, "time": times,
                        "single_step_s": probe["single"]["step_s"], "loopback": lb}
