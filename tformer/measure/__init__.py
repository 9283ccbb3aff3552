"""Measuring what the model really does on this machine: microbenchmarks (matmul curve, STREAM,
GEMV), op-by-op profiles of a step against the ledger, the fixed cost of a framework call, and the
probes that need PyTorch (its build, the GPUs it sees).

    from tformer.measure import run_bench, profile_model
    result = run_bench(quick=True)         # BenchResult: matmul curves, STREAM bandwidth, ratios
    prof = profile_model(config, Workload(phase="train", batch=8, seq=128))   # measured vs predicted, op by op
"""

from tformer.measure.bench import run_bench
from tformer.measure.optime import call_overhead
from tformer.measure.probe import detect_gpus, detect_machine, torch_info
from tformer.measure.profile import ProfileResult, profile_model
from tformer.measure.step import StepRunner, framework_overhead, skeleton, time_skeleton

__all__ = ["ProfileResult", "StepRunner", "call_overhead", "detect_gpus", "detect_machine", "framework_overhead",
           "profile_model", "run_bench", "skeleton", "time_skeleton", "torch_info"]
