"""`tformer bench`: measured matmul FLOP/s and memory bandwidth, saved as this machine's profile."""

import json
import sys
from dataclasses import asdict

from tformer.cli._cost_common import console as make_console
from tformer.core import fmt
from tformer.core.errors import TformerError
from tformer.machine.path_choices import MIN_GAIN, PathTable, record_paths
from tformer.machine.profile_store import save_profile

NAME = "bench"
HELP = "Measure matmul FLOP/s over a size sweep and STREAM bandwidth; save as this machine's profile."


def add_arguments(parser) -> None:
    parser.add_argument("--quick", action="store_true", help="short sweep (under 30 s on a 2-core CPU)")
    parser.add_argument("--json", action="store_true", help="machine-readable output (exact numbers)")
    parser.add_argument("--device", default="all", help="cpu, cuda, cuda:N, or all (default)")
    parser.add_argument("--dtypes", help="comma list from fp32,tf32,fp64,bf16,fp16,int8 (default per device)")
    parser.add_argument("--sizes", help="comma list of matmul sizes n (n x n by n x n) instead of the default sweep")
    parser.add_argument("--reps", type=int, help="timed repetitions per point (default 5 quick, 10 full)")
    parser.add_argument("--threads", type=int, help="CPU threads for the run (default: PyTorch's setting)")
    parser.add_argument("--no-stream", action="store_true", help="skip the bandwidth kernels")
    parser.add_argument("--no-save", action="store_true", help="do not save the result as this machine's profile")


def _sizes(text):
    if text is None:
        return None
    try:
        sizes = [int(s) for s in text.split(",") if s.strip()]
    except ValueError:
        raise TformerError(f"--sizes must be comma-separated integers, got {text!r}") from None
    if not sizes or min(sizes) < 1:
        raise TformerError(f"--sizes must be positive integers, got {text!r}")
    return sizes


def run(args) -> int:
    from tformer.measure.bench import run_bench  # deferred: torch, only when a bench runs

    sizes = _sizes(args.sizes)
    progress = None
    if not args.json and sys.stderr.isatty():
        progress = lambda msg: print(f"  {msg}", file=sys.stderr)  # noqa: E731
    result = run_bench(quick=args.quick, devices=args.device, dtypes=args.dtypes, sizes=sizes, reps=args.reps,
                       stream=not args.no_stream, progress=progress, threads=args.threads)
    path = None
    # A custom sweep is not this machine's representative profile: keep it out of the cache.
    representative = not args.no_save and sizes is None and args.dtypes is None and not args.no_stream \
        and args.threads is None
    if representative:
        path = save_profile(result)
    paths = _linear_paths(args.quick, save=representative) if "cpu" in [d.device for d in result.devices] else []
    if args.json:
        data = result.to_dict()
        data["profile_path"] = path
        data["summary"] = _summary(result)
        data["linear_paths"] = [asdict(p) for p in paths]
        print(json.dumps(data, indent=1))
        return 0
    _print(result, path)
    _print_paths(paths)
    return 0


def _linear_paths(quick: bool, save: bool) -> list:
    """nn.Linear's plain and split paths timed at decode's shapes on this CPU, saved beside the profile
    for tformer.model.linear's choice (which otherwise times a smaller sweep at first use)."""
    # deferred: torch and the model layer, only when a bench runs
    import torch

    from tformer.model import linear_tuning

    threads = torch.get_num_threads()
    if threads < 2:
        return []  # one thread: there is nothing to split over, the plain path is the only one
    points = linear_tuning.measure(linear_tuning.FIRST_USE if quick else linear_tuning.BENCH, threads)
    if save:
        record_paths(points, on_damage=lambda line: print(line, file=sys.stderr))  # a damaged cache is replaced
    return points


def _print_paths(points) -> None:
    if not points:
        return
    from rich.table import Table  # deferred: --json output never loads rich

    t = Table(title=f"cpu: nn.Linear paths at decode's shapes ({points[0].threads} threads, weights streamed "
                    f"from memory; median per call); the split path is taken where it is {MIN_GAIN:.2f}x faster")
    for col in ("rows x k @ n x k", "weight", "plain F.linear", "split rows", "plain / split", "chosen"):
        t.add_column(col, justify="left" if col.startswith("rows") else "right")
    table = PathTable(points)
    for p in points:
        t.add_row(f"{p.rows} x {p.k} @ {p.n} x {p.k}", fmt.in_unit(4 * p.n * p.k, "MiB", 0),
                  f"{p.plain_s * 1e3:.3f} ms", f"{p.path_s * 1e3:.3f} ms", f"{p.gain:.2f}x",
                  table.choose(p.op, p.rows, p.n, p.k, p.threads, p.dtype))
    make_console().print(t)


def _summary(result) -> dict:
    """The headline numbers per device, exact: best fp32 matmul FLOP/s and copy/triad bytes/s."""
    out = {}
    for d in result.devices:
        entry = {}
        for dtype in ("fp32", "tf32", "bf16", "fp16", "fp64", "int8"):
            best = d.best_matmul(dtype)
            if best:
                entry[f"{dtype}_matmul_flops_per_s"] = best.flops_per_s
                entry[f"{dtype}_matmul_best_n"] = best.n
        for kernel in ("copy", "scale", "add", "triad"):
            point = d.best_stream(kernel)
            if point:
                entry[f"{kernel}_bytes_per_s"] = point.bytes_per_s
        out[d.device] = entry
    return out


def _ratio(comp) -> str:
    """measured / theoretical, and on the same line why it is above 1 when it is (never a bare 1.15)."""
    if comp.ratio is None:
        return "-"
    note = comp.above_peak()
    return f"{comp.ratio:.2f}" + (f" ({note})" if note else "")


def _print(result, path) -> None:
    from rich.table import Table  # deferred: --json output never loads rich

    console = make_console()
    for d in result.devices:
        t = Table(title=f"{d.device}: {d.name} — matmul (n x n by n x n, FLOPs = 2n³, median of "
                        f"{d.matmul[0].reps if d.matmul else '?'} reps, warm-up excluded)")
        for col in ("dtype", "n", "median", "min..max time", "FLOP/s (median)", "FLOP/s (best rep)"):
            t.add_column(col, justify="left" if col == "dtype" else "right")
        for p in d.matmul:
            unit = "OPS" if p.dtype == "int8" else "FLOP/s"
            t.add_row(p.dtype, str(p.n), f"{p.median_s * 1e3:.3f} ms", f"{p.min_s * 1e3:.3f}..{p.max_s * 1e3:.3f} ms",
                      fmt.si(p.flops_per_s, unit, decimals=1), fmt.si(p.flops_per_s_best, unit, decimals=1))
        console.print(t)
        if d.stream:
            s = Table(title=f"{d.device}: STREAM bandwidth (fp32 arrays of {d.stream[0].elements:,} elements = "
                            f"{fmt.in_unit(d.stream[0].elements * 4, 'MiB', 0)}; copy/scale count 2 arrays, add/triad 3)")
            for col in ("kernel", "bytes/call", "median", "min..max time", "bandwidth (median)", "best rep"):
                s.add_column(col, justify="left" if col == "kernel" else "right")
            for p in d.stream:
                s.add_row(p.kernel, f"{p.bytes:,}", f"{p.median_s * 1e3:.2f} ms",
                          f"{p.min_s * 1e3:.2f}..{p.max_s * 1e3:.2f} ms",
                          fmt.in_unit(p.bytes_per_s, "GB/s"), fmt.in_unit(p.bytes_per_s_best, "GB/s"))
            console.print(s)
        c = Table(title=f"{d.device}: measured vs theoretical")
        for col in ("quantity", "measured", "theoretical", "ratio", "likely reasons for the gap"):
            c.add_column(col, justify="right" if col in ("measured", "theoretical", "ratio") else "left")
        for comp in d.comparisons:
            theo = fmt.si(comp.theoretical, comp.unit, decimals=1) if comp.theoretical else comp.theoretical_source
            c.add_row(comp.quantity, fmt.si(comp.measured, comp.unit, decimals=1), theo, _ratio(comp),
                      "\n".join(f"• {r}" for r in comp.reasons))
        console.print(c)
        for note in d.skipped:
            console.print(f"skipped: {note}")
    if result.load_before is not None:
        console.print(f"load average when the run started: {result.load_before:.2f} on {result.logical_cpus} CPUs "
                      "(above ~0.5 other processes were competing for the cores)")
    console.print(f"took {result.wall_s:.1f} s ({'quick' if result.quick else 'full'} mode); machine key "
                  f"{result.machine_key}")
    if path:
        console.print(f"saved as this machine's profile: {path} (use it with --hardware measured)")
    else:
        console.print("not saved (custom sweep or --no-save)")
