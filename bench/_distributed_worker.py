"""One rank of bench/distributed.py (started by torchrun): for DDP, FSDP2 full_shard and FSDP2
shard_grad_op, the bytes this rank holds in parameters, gradients and optimizer state (its local
shards), the bytes its collectives move per step, its step time, and the loopback all-reduce bandwidth.
Rank 0 writes them as JSON to --out. With one process (no torchrun) it times the plain model instead:
the single-device step the scaling efficiency is measured against.

    python -m torch.distributed.run --standalone --nproc_per_node 2 bench/_distributed_worker.py --out r.json
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import statistics
import time

import torch
import torch.distributed as dist

from tformer.core.atomic import atomic_write_text
from tformer.core.config import preset
from tformer.model import build
from tformer.model.runners import runner_for
from tformer.train import distributed as dist_util
from tformer.train import fsdp

LAYOUTS = {"ddp": 0, "full_shard": 3, "shard_grad_op": 2}  # name -> ZeRO stage (cost.layout.parse_zero)
BANDWIDTH_BYTES = 16 << 20


def parse(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--preset", default="char-small")
    parser.add_argument("--override", action="append", default=[], help="config override key=value (repeatable)")
    parser.add_argument("--batch", type=int, default=4, help="sequences per rank (one data-parallel replica)")
    parser.add_argument("--seq", type=int, default=32)
    parser.add_argument("--warmup", type=int, default=2)
    parser.add_argument("--steps", type=int, default=5, help="timed steps; the median is reported")
    parser.add_argument("--layouts", default=",".join(LAYOUTS))
    parser.add_argument("--bandwidth-bytes", type=int, default=BANDWIDTH_BYTES)
    parser.add_argument("--out", required=True)
    return parser.parse_args(argv)


def config_of(args):
    base = preset(args.preset)
    return base.with_overrides(args.override) if args.override else base


def nbytes(t: torch.Tensor) -> int:
    """Bytes of this rank's piece: a DTensor's local shard, a plain tensor whole."""
    local = t.to_local() if hasattr(t, "to_local") else t
    return local.numel() * local.element_size()


def param_bytes(model) -> int:
    return sum(nbytes(p) for p in model.parameters())  # parameters() yields a tied table once


def grad_bytes(model) -> int:
    return sum(nbytes(p.grad) for p in model.parameters() if p.grad is not None)


def optimizer_bytes(opt) -> int:
    # The moments only: AdamW's scalar ``step`` is bookkeeping, not the K bytes per parameter.
    return sum(nbytes(v) for state in opt.state.values() for k, v in state.items() if k in ("exp_avg", "exp_avg_sq"))


@contextlib.contextmanager
def counted_collectives(tally: dict):
    """Count the payloads FSDP2 hands to torch.distributed (it calls all_gather_single and
    reduce_scatter_single through the module, so wrapping the module's names sees every call):
    an all-gather's whole (padded) output and a reduce-scatter's whole (padded) input."""
    gather, scatter = dist.all_gather_single, dist.reduce_scatter_single

    def all_gather_single(output_tensor, input_tensor, *a, **k):
        tally["all_gather"] = tally.get("all_gather", 0) + output_tensor.numel() * output_tensor.element_size()
        return gather(output_tensor, input_tensor, *a, **k)

    def reduce_scatter_single(*a, **k):
        tensor = k["input"] if "input" in k else a[1]
        tally["reduce_scatter"] = tally.get("reduce_scatter", 0) + tensor.numel() * tensor.element_size()
        return scatter(*a, **k)

    dist.all_gather_single, dist.reduce_scatter_single = all_gather_single, reduce_scatter_single
    try:
        yield tally
    finally:
        dist.all_gather_single, dist.reduce_scatter_single = gather, scatter


def _counting_allreduce(state: dict, bucket):
    """DDP communication hook: count the bucket's payload, then all-reduce it as DDP would."""
    # deferred: torch.distributed's hook module loads only for a distributed run
    from torch.distributed.algorithms.ddp_comm_hooks import default_hooks

    buffer = bucket.buffer()
    state["all_reduce"] = state.get("all_reduce", 0) + buffer.numel() * buffer.element_size()
    return default_hooks.allreduce_hook(None, bucket)


class Replica:
    """One model, its optimizer and one batch of random ids for a layout; ``step`` runs a training step."""

    def __init__(self, config, layout: str | None, batch: int, seq: int, rank: int):
        torch.manual_seed(0)  # the same initial weights on every rank, as DDP and FSDP expect
        self.model = build(config)
        self.model.train()
        self.runner = runner_for(self.model)
        gen = torch.Generator().manual_seed(1000 + rank)  # each replica its own data
        self.batch = self.runner.example_batch(torch.randint(0, config.vocab_size, (batch, seq), generator=gen))
        self.hooked: dict = {}
        self.train = self.model
        if layout == "ddp":
            self.train = dist_util.wrap_ddp(self.model, torch.device("cpu"))
            self.train.register_comm_hook(self.hooked, _counting_allreduce)
        elif layout is not None:
            fsdp.shard(self.model, reshard_after_forward=LAYOUTS[layout] == 3)
        # fp32 AdamW over the (local shards of the) parameters: built after sharding, as FSDP2 requires
        self.opt = torch.optim.AdamW(self.model.parameters(), lr=1e-4, weight_decay=0.1)

    def step(self, probe: dict | None = None) -> None:
        if probe is not None:
            probe["weights_at_rest"] = param_bytes(self.model)
        loss = self.runner.loss(self.batch, module=self.train)
        if probe is not None:
            # Between forward and backward: shard_grad_op (reshard_after_forward=False) keeps every
            # unit's gathered, whole weights registered on the modules until its backward is done, so
            # this is when a ZeRO-2 rank's parameters are largest; full_shard has freed the Blocks'
            # gathered weights again (only the root unit, which FSDP2 never reshards after forward,
            # stays whole).
            probe["weights_after_forward"] = param_bytes(self.model)
        loss.backward()
        if probe is not None:
            probe["gradients"] = grad_bytes(self.model)
        self.opt.step()
        self.opt.zero_grad(set_to_none=True)
        if probe is not None:
            probe["optimizer"] = optimizer_bytes(self.opt)


def timed_steps(replica: Replica, warmup: int, steps: int, synced: bool) -> list[float]:
    times = []
    for i in range(warmup + steps):
        if synced:
            dist.barrier()  # every rank starts together, so no rank's wait for a slower one is counted twice
        t0 = time.perf_counter()
        replica.step()
        if i >= warmup:
            times.append(time.perf_counter() - t0)
    return times


def measure_layout(config, layout: str, args, world: int, rank: int) -> dict:
    replica = Replica(config, layout, args.batch, args.seq, rank)
    replica.step()  # warm-up: optimizer state exists, DDP's buckets are rebuilt to their final order
    probe: dict = {}
    replica.hooked.clear()
    with counted_collectives({}) as tally:
        replica.step(probe)
    collectives = {**tally, **replica.hooked}  # one step's worth, before the timed steps add theirs
    times = timed_steps(replica, args.warmup, args.steps, synced=True)
    weights = probe["weights_after_forward"] if LAYOUTS[layout] == 2 else probe["weights_at_rest"]
    return {"layout": layout, "zero": LAYOUTS[layout], "weights": weights, **probe,
            "collectives": collectives,
            "step_s": statistics.median(times), "step_times_s": times, "world": world, "rank": rank}


def loopback_bandwidth(size_bytes: int, world: int, repeats: int = 5) -> dict:
    """Bus bandwidth of an fp32 all-reduce: 2 (N - 1) / N x bytes each rank sends, over the seconds."""
    x = torch.ones(size_bytes // 4)
    dist.all_reduce(x)  # warm-up: the ring's connections are set up
    times = []
    for _ in range(repeats):
        dist.barrier()
        t0 = time.perf_counter()
        dist.all_reduce(x)
        times.append(time.perf_counter() - t0)
    seconds = statistics.median(times)
    return {"bytes": size_bytes, "seconds": seconds, "bus_bytes_per_s": 2 * (world - 1) / world * size_bytes / seconds}


def single(args) -> dict:
    """The plain model in one process: the step a data-parallel replica repeats."""
    replica = Replica(config_of(args), None, args.batch, args.seq, 0)
    replica.step()
    times = timed_steps(replica, args.warmup, args.steps, synced=False)
    return {"step_s": statistics.median(times), "step_times_s": times, "world": 1}


def main(argv=None) -> None:
    args = parse(argv)
    torch.set_num_threads(1)  # one core per rank: the ranks must not fight over the same cores
    if int(os.environ.get("WORLD_SIZE", "1")) == 1:
        atomic_write_text(args.out, json.dumps({"single": single(args)}, indent=1) + "\n")
        return
    w = dist_util.init_from_env("cpu")
    try:
        config = config_of(args)
        layouts = [measure_layout(config, name, args, w.size, w.rank) for name in args.layouts.split(",")]
        bandwidth = loopback_bandwidth(args.bandwidth_bytes, w.size)
        if w.rank == 0:
            doc = {"world": w.size, "layouts": layouts, "loopback": bandwidth,
                   "config": {"preset": args.preset, "override": args.override}, "batch": args.batch, "seq": args.seq}
            atomic_write_text(args.out, json.dumps(doc, indent=1) + "\n")
    finally:
        dist_util.shutdown()


if __name__ == "__main__":
    main()
