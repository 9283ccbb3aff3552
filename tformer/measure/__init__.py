"""Measuring what the model really does on this machine: microbenchmarks (matmul curve, STREAM,
GEMV), op-by-op profiles of a step against the ledger, and the fixed cost of a framework call.

    from tformer.measure import run_bench, profile_model
    result = run_bench(quick=True)         # BenchResult: matmul curves, STREAM bandwidth, ratios
"""

from tformer.measure.bench import run_bench

__all__ = ["run_bench"]
