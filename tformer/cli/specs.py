"""`tformer specs`: what this machine is, and its theoretical peaks with their sources."""

import json

from tformer.cli._cost_common import console as make_console
from tformer.core import fmt
from tformer.core.errors import TformerError
from tformer.core.inputs import Bounds

NAME = "specs"
HELP = "Show this machine's CPU, caches, memory and GPUs, and theoretical peak FLOP/s and bandwidth."
# Wide of any CPU and memory made, and narrow enough that the peak formulas give finite numbers.
NUMBERS = {"clock_ghz": Bounds(1e-3, 1e3, note="GHz"), "fma_units": Bounds(1, 64, integer=True),
           "simd_bits": Bounds(64, 8192, integer=True), "memory_mts": Bounds(1, 1e6, note="MT/s"),
           "memory_channels": Bounds(1, 1024, integer=True), "memory_bus_bits": Bounds(1, 8192, integer=True)}


def add_arguments(parser) -> None:
    parser.add_argument("--json", action="store_true", help="machine-readable output (exact numbers)")
    parser.add_argument("--clock-ghz", type=float, help="clock for the peak formula (when not readable or to override)")
    parser.add_argument("--fma-units", type=int, help="FMA units per core (override the assumption)")
    parser.add_argument("--simd-bits", type=int, help="SIMD register width in bits (override the detection)")
    parser.add_argument("--memory-mts", type=float, help="DRAM transfer rate in MT/s, e.g. 3200 for DDR4-3200")
    parser.add_argument("--memory-channels", type=int, help="number of populated memory channels")
    parser.add_argument("--memory-bus-bits", type=int, default=64, help="bits per channel (default 64)")


def _check(args) -> None:
    if args.simd_bits is not None and args.simd_bits % 64:
        raise TformerError(f"--simd-bits must be a multiple of 64 (128, 256, 512), got {args.simd_bits}")


def run(args) -> int:
    from tformer.measure.probe import detect_machine  # deferred: torch, for the GPUs and the PyTorch build

    _check(args)
    specs = detect_machine(clock_ghz=args.clock_ghz, fma_units=args.fma_units, simd_bits=args.simd_bits,
                   memory_mt_s=args.memory_mts, memory_channels=args.memory_channels,
                   memory_bus_bits=args.memory_bus_bits)
    if args.json:
        print(json.dumps(specs.to_dict(), indent=1))
        return 0

    # deferred: rich loads only when something is printed with it
    from rich.table import Table

    console = make_console()
    cpu, mem = specs.cpu, specs.memory
    t = Table(title="CPU", show_header=False)
    t.add_column("field")
    t.add_column("value")

    t.add_row("model", f"{cpu.model} ({cpu.vendor}, {cpu.arch}"
              + (f", family {cpu.family} model {cpu.model_id}" if cpu.family is not None else "") + ")")
    t.add_row("cores / threads", f"{cpu.physical_cores or 'unknown'} physical / {cpu.logical_cpus} logical"
              + (f" ({cpu.usable_cpus} usable by this process)" if cpu.usable_cpus != cpu.logical_cpus else ""))
    t.add_row("SIMD / FMA", f"{cpu.simd_bits or '?'}-bit, {cpu.fma_units or '?'} FMA units/core ({cpu.vector_source})")
    t.add_row("flags", " ".join(f for f, on in cpu.flags.items() if on) or "none of interest")
    t.add_row("clock", f"base {fmt.hz(cpu.base_clock_hz)}, max {fmt.hz(cpu.max_clock_hz)}, "
              f"current {fmt.hz(cpu.current_clock_hz)}")
    t.add_row("caches", ", ".join(f"L{c.level} {c.type.lower()} {fmt.si(c.size_bytes, 'B', decimals=1)}"
                                  f" ({c.size_bytes // 1024} KiB)" for c in cpu.caches) or "unknown")
    t.add_row("memory", f"{fmt.in_unit(mem.total_bytes, 'GiB')} ({mem.total_bytes:,} B); type {mem.type}, speed "
              f"{f'{mem.speed_mt_s:g} MT/s' if mem.speed_mt_s else 'unknown'} ({mem.source})"
              if mem.total_bytes else "unknown")
    t.add_row("torch", f"{specs.torch.get('version')} threads={specs.torch.get('threads')} "
              f"cpu_capability={specs.torch.get('cpu_capability')} mkldnn={specs.torch.get('mkldnn')}")
    t.add_row("hypervisor", "yes" if cpu.hypervisor else "no")
    console.print(t)

    p = Table(title="CPU theoretical peaks (FLOPs = 2 x multiply-accumulates; int8 in OPS)")
    p.add_column("dtype")
    p.add_column("peak", justify="right")
    p.add_column("source")
    for dtype, peak in specs.cpu_peaks.items():
        p.add_row(dtype, fmt.si(peak.value, peak.unit, decimals=1) if peak.value else "-", peak.source)
    bw = specs.cpu_bandwidth
    p.add_row("DRAM bandwidth", fmt.si(bw.value, "B/s", decimals=1) if bw.value else "-", bw.source)
    console.print(p)

    if not specs.gpus:
        console.print("GPUs: none visible to PyTorch (torch.cuda.is_available() is False)")
    for g in specs.gpus:
        gt = Table(title=f"GPU {g.index}: {g.name}")
        gt.add_column("quantity")
        gt.add_column("value", justify="right")
        gt.add_column("source")
        gt.add_row("memory", fmt.in_unit(g.memory_bytes, "GiB") if g.memory_bytes else "unknown", g.source)
        gt.add_row("SMs / compute capability", f"{g.sm_count} / {g.compute_capability}", g.source)
        gt.add_row("SM clock max", fmt.hz(g.sm_clock_max_hz), g.source)
        gt.add_row("memory clock / bus", f"{fmt.hz(g.mem_clock_max_hz)} / {g.mem_bus_bits or '?'} bit", g.source)
        gt.add_row("spec-table entry", g.table_entry or "none (unknown GPU: tensor peaks unknown)", "")
        for key, peak in specs.gpu_peaks.get(g.index, {}).items():
            label = key.replace("_tensor_sparse", " tensor cores, 2:4 sparse").replace("_tensor", " tensor cores")
            label = "bandwidth" if key == "bandwidth" else label + ("" if "tensor" in key else " (no tensor cores)")
            gt.add_row(label, fmt.si(peak.value, peak.unit, decimals=1) if peak.value else "-", peak.source)
        console.print(gt)
    for note in specs.notes:
        console.print(f"note: {note}")
    return 0
