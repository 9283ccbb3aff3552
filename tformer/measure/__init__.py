"""Measuring the machine: what it is (specs), what it really does (bench), and the saved profile.

    from tformer.measure import detect, run_bench, load_measured_device
    specs = detect()                       # MachineSpecs: CPU, memory, GPUs, theoretical peaks
    result = run_bench(quick=True)         # BenchResult: matmul curves, STREAM bandwidth, ratios
    device = load_measured_device()        # Device(kind="measured") from the saved profile, or None
"""

from tformer.measure.bench import run_bench
from tformer.measure.bench_records import BenchResult
from tformer.measure.profile_store import load_measured_device, load_profile, save_profile
from tformer.measure.specs import MachineSpecs, detect

__all__ = ["BenchResult", "MachineSpecs", "detect", "load_measured_device", "load_profile", "run_bench",
           "save_profile"]
