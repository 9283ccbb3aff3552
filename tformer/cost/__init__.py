"""The ledger: what a Transformer costs, op by op (parameters, FLOPs, bytes, time on a device).

    from tformer.cost.ledger import Workload, ledger
    from tformer.cost.roofline import roofline
    lg = ledger(config, Workload(phase="train", batch=8, seq=1024, dtype="bf16", mixed_precision=True))
    lg.params["total"], lg.flops["matmul"], lg.memory["total"], roofline(lg, device).time_s

Modules: architecture (one description of each architecture, read by the model too), workload,
ops (the Op record and primitive costs), attention (the attention rows, one cost function per
attention kind), oplist (walks the description into ops), ledger (the op list and its totals), memory,
roofline, batching (decode speed by batch size: what batching buys), scaling (what-ifs, crossovers,
training runs, compute-optimal sizes), formulas (the
textbook's closed forms), conventions (the conventions in force; the course's count), hardware.
"""

# Only names that do not shadow a submodule (tformer.cost.ledger stays the module).
from tformer.cost.conventions import course_flops  # noqa: E402
from tformer.cost.ledger import Ledger, Workload  # noqa: E402
from tformer.cost.ops import Op  # noqa: E402

__all__ = ["Ledger", "Op", "Workload", "course_flops"]
