"""`tformer profile`: run a real model for a phase, time every op, and hold the ledger's prediction to it."""
import json
import sys

from tformer.cli._cost_common import add_model_arguments, load_config
from tformer.cli._profile_print import print_result
from tformer.core.errors import TformerError
from tformer.cost.ledger import Workload

NAME = "profile"
HELP = ("Run a model (random weights) for a phase; per-op measured vs predicted time, FLOPs, MFU/HFU, "
        "peak memory, and training vs inference utilisation.")


def add_arguments(parser) -> None:
    add_model_arguments(parser)
    parser.add_argument("--phase", default="train", choices=["forward", "train", "prefill", "decode", "all"],
                        help="what to run (default train); 'all': train, prefill and decode (encoders: train, forward)")
    parser.add_argument("--batch", type=int, default=None,
                        help="sequences per step (default 1 for decode, the single-stream latency case; 8 otherwise)")
    parser.add_argument("--seq", type=int, default=None, help="tokens per sequence (default min(128, max_positions))")
    parser.add_argument("--seq-decoder", type=int, default=None, help="encoder-decoder target length (default --seq)")
    parser.add_argument("--context", type=int, default=None, help="decode: tokens already in the KV cache (default seq - 1)")
    parser.add_argument("--dtype", default="fp32", choices=["fp32", "bf16"], help="weights and activations")
    parser.add_argument("--optimizer", default="adamw", choices=["sgd", "momentum", "adam", "adamw"])
    parser.add_argument("--hardware", metavar="NAME|FILE",
                        help="device for the prediction (default: this machine's measured profile; a quick bench "
                             "is run and saved first when none is)")
    parser.add_argument("--device", default=None, help="torch device to run on: cpu, cuda, cuda:N (default: GPU if any)")
    parser.add_argument("--efficiency", type=float, default=1.0, help="fraction of the roofs reached (default 1)")
    parser.add_argument("--steps", type=int, default=5, help="timed steps (median reported; default 5)")
    parser.add_argument("--warmup", type=int, default=2, help="untimed steps first (default 2)")
    parser.add_argument("--ops", action="store_true", help="print the per-op table")
    parser.add_argument("--keep-denormals", action="store_true",
                        help="do not flush denormal floats to zero (CPU; slow microcode path included)")
    parser.add_argument("--json", action="store_true", help="machine-readable output (exact numbers)")


def _workloads(args, config):

    if args.batch is not None and args.batch < 1:
        raise TformerError(f"--batch must be at least 1, got {args.batch}")
    seq = args.seq if args.seq is not None else min(128, config.max_positions)
    if seq < 1:
        raise TformerError(f"--seq must be at least 1, got {seq}")
    phases = [args.phase]
    if args.phase == "all":
        phases = list(config.traits.compared_phases)
    out = []
    for phase in phases:
        batch = args.batch if args.batch is not None else (1 if phase == "decode" else 8)
        out.append(Workload(phase=phase, batch=batch, seq=seq, seq_decoder=args.seq_decoder,
                            context=args.context if phase == "decode" else None, dtype=args.dtype,
                            optimizer=args.optimizer))
    return out


def run(args) -> int:

    # deferred: loaded only when this command runs, so `tformer --help` and the cost commands stay fast
    import torch

    if not args.keep_denormals:
        # Before any parallel op: OpenMP worker threads inherit the flush-to-zero bit when created.
        torch.set_flush_denormal(True)

    # deferred: loaded only when this command runs, so `tformer --help` and the cost commands stay fast
    from tformer.measure.profile import profile_model

    config = load_config(args)
    workloads = _workloads(args, config)
    for label in ("steps", "warmup"):
        value = getattr(args, label)
        if value < (1 if label == "steps" else 0):
            raise TformerError(f"--{label} must be at least {1 if label == 'steps' else 0}, got {value}")
    progress = None
    if not args.json and sys.stderr.isatty():
        progress = lambda msg: print(f"  {msg}", file=sys.stderr)  # noqa: E731
    results = []
    for w in workloads:
        results.append(profile_model(config, w, device=args.device, hardware=args.hardware, steps=args.steps,
                                     warmup=args.warmup, efficiency=args.efficiency, progress=progress,
                                     flush_denormals=not args.keep_denormals))
    if len(results) > 1:  # the comparison gets every measured MFU
        measured = {r.workload["phase"]: r.utilization.mfu_measured for r in results}
        for r in results:
            for row in r.phases:
                row.measured_mfu = measured.get(row.phase, row.measured_mfu)
    if args.json:
        data = [r.to_dict() for r in results]
        print(json.dumps(data[0] if len(data) == 1 else data, indent=1))
        return 0

    for i, r in enumerate(results):
        print_result(r, ops=args.ops, comparison=(i == len(results) - 1))
    return 0
