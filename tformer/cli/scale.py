"""`tformer scale`: what changes when the model or workload grows, where attention overtakes the
FFN, when decode turns compute-bound, and what a training run or a compute budget buys."""

import json
from dataclasses import replace

from tformer.cli._cost_common import (
    LAYOUT_NUMBERS,
    WORKLOAD_NUMBERS,
    add_layout_arguments,
    add_model_arguments,
    add_workload_arguments,
    console,
    layout_summary,
    load_config,
    load_device,
    load_layout,
    load_workload,
)
from tformer.cli._parallel_print import print_parallel
from tformer.core import fmt
from tformer.core.errors import TformerError
from tformer.core.inputs import Bounds
from tformer.cost import scaling
from tformer.cost.ledger import ledger
from tformer.cost.roofline import COMPUTE_DTYPE, roofline

NAME = "scale"
HELP = "What-if table (double d_model, layers, seq, batch or any factor), crossovers, training time and compute-optimal sizes."
# The training run's and the budget's ends: a budget or a run of more than 1e50 FLOPs, or a millionth of the
# peak, says nothing a smaller one does not, and keeps every time and price a finite float.
NUMBERS = {**WORKLOAD_NUMBERS, **LAYOUT_NUMBERS,
           "factor": Bounds(1e-6, 1e6, note="each knob is multiplied by it, e.g. 2 or 0.5"),
           "train_tokens": Bounds(1, 1e30, note="tokens to train on"),
           "utilization": Bounds(1e-6, 1, note="the fraction of peak reached"),
           "price": Bounds(0, 1e12, note="per device-hour"),
           "budget": Bounds(1, 1e50, note="FLOPs")}


def add_arguments(parser) -> None:
    add_model_arguments(parser)
    add_workload_arguments(parser)
    parser.add_argument("--factor", type=float, default=2.0, help="multiply each knob by this (default 2)")
    parser.add_argument("--knobs", help="comma-separated: d_model,n_layers,seq,batch (image models: image_size "
                                         "for seq; default: all that apply)")
    parser.add_argument("--train-tokens", type=float, help="training run: tokens to train on (e.g. 3e11)")
    parser.add_argument("--devices", type=int, default=1,
                        help="devices: the training run's count, and the layout's (data = devices / (tp x pp))")
    parser.add_argument("--utilization", type=float, default=0.4, help="training run: fraction of peak reached (default 0.4)")
    parser.add_argument("--price", type=float, help="training run: price per device-hour (any currency)")
    parser.add_argument("--budget", type=float, help="compute budget in FLOPs: Kaplan and Chinchilla optimal sizes")
    add_layout_arguments(parser, devices=False)


def run(args) -> int:
    config = load_config(args)
    workload = load_workload(args, config)
    device = load_device(args.hardware)
    knobs = (tuple(k.strip() for k in args.knobs.split(",") if k.strip()) if args.knobs
             else scaling.default_knobs(config))
    if not args.factor > 0 or args.factor == float("inf"):  # nan fails the first test
        raise TformerError(f"--factor must be a finite positive number, got {args.factor}; e.g. 2 or 0.5")
    out = {"what_if": scaling.what_if(config, workload, args.factor, device, args.efficiency, knobs),
           "attention_crossover": scaling.attention_crossover(config)}
    if device is not None and config.has_decoder:
        context = workload.decode_context if workload.phase == "decode" else workload.seq - 1
        out["decode_compute_bound_batch"] = scaling.decode_compute_bound_batch(config, context, device, workload.dtype)
    layout = load_layout(args, config, workload)
    parallel = None
    if not layout.single or (device is not None and device.memory_bytes):
        roof = roofline(ledger(config, workload), device, args.efficiency) if device is not None else None
        parallel = layout_summary(args, config, workload, layout, device, roof)
        out["parallel"] = parallel
    if args.train_tokens is not None:
        if device is None or not device.peak(COMPUTE_DTYPE[workload.dtype]):
            raise TformerError("--train-tokens needs --hardware with a known peak for the chosen --dtype")
        tw = workload if workload.phase == "train" else _as_train(workload)
        peak = device.peak(COMPUTE_DTYPE[workload.dtype])
        out["training_run"] = scaling.training_run(
            config, args.train_tokens, args.devices, args.utilization, peak,
            price_per_device_hour=args.price, workload=tw)
        need = (parallel or {}).get("devices_needed") or {}
        if need.get("devices"):  # the same run on the fewest devices that hold it
            out["training_run_at_devices_needed"] = scaling.training_run(
                config, args.train_tokens, need["devices"], args.utilization, peak,
                price_per_device_hour=args.price, workload=tw)
    if args.budget is not None:
        out["compute_optimal"] = {"chinchilla_20_tokens_per_param": scaling.chinchilla_optimal(args.budget),
                                  "chinchilla_fit": scaling.chinchilla_optimal_fit(args.budget),
                                  "kaplan": scaling.kaplan_optimal(args.budget)}
    if args.json:
        print(json.dumps(out, indent=1, default=str))
        return 0
    _print(out, config, workload, args.factor)
    if parallel is not None:
        print_parallel(parallel, workload)
    return 0


def _as_train(workload):
    return replace(workload, phase="train", context=None)


def _print(out, config, workload, factor) -> None:
    from rich.table import Table  # deferred: --json output never loads rich

    con = console()
    wi = out["what_if"]
    base = wi["base"]
    t = Table(title=f"What if each knob is x{factor:g}? ({getattr(config, 'name', 'custom')}, {workload.phase}, "
                    f"batch {workload.batch}, seq {workload.seq}, {workload.dtype})")
    for col in ("knob", "params", "FLOPs", "activations", "KV cache", "time"):
        t.add_column(col, justify="left" if col == "knob" else "right")
    t.add_row("baseline", fmt.params(base["params"], word=True), fmt.flops(base["flops"]), fmt.nbytes_gb(base["activations"]),
              fmt.nbytes_gb(base["kv_cache"]), fmt.duration(base["time_s"]) if base["time_s"] is not None else "- (no --hardware)")

    def ratio(r):
        return f"x{r:.3f}" if r is not None else "-"

    for row in wi["rows"]:
        r = row["ratios"]
        t.add_row(f"{row['knob']} x{factor:g}", ratio(r["params"]), ratio(r["flops"]), ratio(r["activations"]),
                  ratio(r["kv_cache"]), ratio(r["time_s"]))
    con.print(t)
    x = out["attention_crossover"]
    if config.traits.vision_only:  # tokens come from the image: n = (side / P)^2 + 1
        side = lambda n: f"{config.patch_size * max(n - 1, 0) ** 0.5:,.0f} px"
        con.print(f"QK^T + AV overtake the FFN at n ≈ {x['vs_ffn']:,} image tokens (a {side(x['vs_ffn'])} image at "
                  f"patch {config.patch_size}) and the q/k/v/o projections at n ≈ {x['vs_projections']:,} "
                  f"({side(x['vs_projections'])}) ({x['note']})")
    else:
        con.print(f"QK^T + AV overtake the FFN at seq ≈ {x['vs_ffn']:,} tokens and the q/k/v/o projections at "
                  f"seq ≈ {x['vs_projections']:,} tokens ({x['note']})")
    if "decode_compute_bound_batch" in out:
        d = out["decode_compute_bound_batch"]
        if d.get("batch"):
            con.print(f"decode turns compute-bound at batch ≥ {d['batch']:,} (ridge {d['ridge_point']:.4g} FLOP/B)")
        else:
            con.print(f"decode compute-bound batch: {d.get('batch') or 'never'} — {d.get('reason', '')}")
    if "training_run" in out:
        r = out["training_run"]
        con.print(f"training on {r['tokens']:.4g} tokens: {fmt.flops(int(r['flops']))} (6ND rule "
                  f"{r['flops_6nd']:.4g} FLOPs), {_run_cost(r)}")
    if "training_run_at_devices_needed" in out:
        r = out["training_run_at_devices_needed"]
        con.print(f"on the fewest devices that hold it: {_run_cost(r)}")
    if "compute_optimal" in out:
        for name, v in out["compute_optimal"].items():
            con.print(f"{name}: N = {v['params']:.4g} params, D = {v['tokens']:.4g} tokens ({v['rule']})")


def _run_cost(r: dict) -> str:
    """A training run's wall-clock time, device-hours and (with a price) cost, in one phrase."""
    line = f"{r['devices']:,} device(s), {fmt.duration(r['seconds'])} wall-clock, {r['device_hours']:,.1f} device-hours"
    return line + (f", cost {r['cost']:,.2f} (price x device-hours)" if "cost" in r else "")
