"""One rank of a measured data-parallel run (started by torchrun through tformer.train.parallel_check).

For DDP, FSDP2 full_shard and FSDP2 shard_grad_op it records the bytes this rank holds in parameters,
gradients and optimizer state (its local shards), the payloads its collectives move in one step, its
step time, and the loopback link (all-reduce latency and bandwidth). Before joining the process group, rank 0 times the
plain model alone (the other ranks wait at the rendezvous, asleep): the single-device step the scaling
efficiency is measured against. Rank 0 writes everything as JSON to --out.

    python -m torch.distributed.run --standalone --nproc_per_node 2 -m tformer.train.parallel_probe \\
        --config model.json --out measured.json
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
from tformer.core.config import ModelConfig
from tformer.data.batch import example_batch
from tformer.model import build
from tformer.model.runners import runner_for
from tformer.train import distributed as dist_util
from tformer.train import fsdp

LAYOUTS = {"ddp": 0, "full_shard": 3, "shard_grad_op": 2}  # name -> ZeRO stage (cost.layout.parse_zero)
BANDWIDTH_BYTES = 16 << 20


def parse(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--config", required=True, help="the model's tformer config JSON")
    parser.add_argument("--batch", type=int, default=4, help="sequences per rank (one data-parallel replica)")
    parser.add_argument("--seq", type=int, default=32)
    parser.add_argument("--warmup", type=int, default=2)
    parser.add_argument("--steps", type=int, default=5, help="timed steps; the median is reported")
    parser.add_argument("--layouts", default=",".join(LAYOUTS))
    parser.add_argument("--bandwidth-bytes", type=int, default=BANDWIDTH_BYTES)
    parser.add_argument("--out", required=True)
    return parser.parse_args(argv)


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


def _count(tally: dict, calls: dict, kind: str, tensor: torch.Tensor) -> None:
    tally[kind] = tally.get(kind, 0) + tensor.numel() * tensor.element_size()
    calls[kind] = calls.get(kind, 0) + 1


@contextlib.contextmanager
def counted_collectives(tally: dict, calls: dict):
    """Count the payloads FSDP2 hands to torch.distributed (it calls all_gather_single and
    reduce_scatter_single through the module, so wrapping the module's names sees every call):
    an all-gather's whole (padded) output and a reduce-scatter's whole (padded) input; and the calls."""
    gather, scatter = dist.all_gather_single, dist.reduce_scatter_single

    def all_gather_single(output_tensor, input_tensor, *a, **k):
        _count(tally, calls, "all_gather", output_tensor)
        return gather(output_tensor, input_tensor, *a, **k)

    def reduce_scatter_single(*a, **k):
        _count(tally, calls, "reduce_scatter", k["input"] if "input" in k else a[1])
        return scatter(*a, **k)

    dist.all_gather_single, dist.reduce_scatter_single = all_gather_single, reduce_scatter_single
    try:
        yield tally
    finally:
        dist.all_gather_single, dist.reduce_scatter_single = gather, scatter


def _counting_allreduce(state: dict, bucket):
    """DDP communication hook: count the bucket's payload and the call, then all-reduce it as DDP would."""
    # deferred: torch.distributed's hook module loads only for a distributed run
    from torch.distributed.algorithms.ddp_comm_hooks import default_hooks

    _count(state["bytes"], state["calls"], "all_reduce", bucket.buffer())
    return default_hooks.allreduce_hook(None, bucket)


class Replica:
    """One model, its optimizer and one batch of random ids for a layout; ``step`` runs a training step."""

    def __init__(self, config, layout: str | None, batch: int, seq: int, rank: int):
        torch.manual_seed(0)  # the same initial weights on every rank, as DDP and FSDP expect
        self.model = build(config)
        self.model.train()
        self.runner = runner_for(self.model)
        gen = torch.Generator().manual_seed(1000 + rank)  # each replica its own data
        self.batch = example_batch(config, torch.randint(0, config.vocab_size, (batch, seq), generator=gen))
        self.hooked: dict = {"bytes": {}, "calls": {}}
        self.train = self.model
        if layout is not None:
            dist_util.freeze_unreached(self.model, self.runner.loss_skips)
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
    for counts in replica.hooked.values():
        counts.clear()  # in place: the DDP hook holds this dict as its state
    tally, calls = {}, {}
    with counted_collectives(tally, calls):
        replica.step(probe)
    # one step's worth, before the timed steps add theirs
    collectives, calls = {**tally, **replica.hooked["bytes"]}, {**calls, **replica.hooked["calls"]}
    times = timed_steps(replica, args.warmup, args.steps, synced=True)
    weights = probe["weights_after_forward"] if LAYOUTS[layout] == 2 else probe["weights_at_rest"]
    return {"layout": layout, "zero": LAYOUTS[layout], "weights": weights, **probe,
            "collectives": collectives, "calls": calls,
            "step_s": statistics.median(times), "step_times_s": times, "world": world, "rank": rank}


def _median_all_reduce_s(x: torch.Tensor, repeats: int) -> float:
    dist.all_reduce(x)  # warm-up: the ring's connections are set up
    times = []
    for _ in range(repeats):
        dist.barrier()
        t0 = time.perf_counter()
        dist.all_reduce(x)
        times.append(time.perf_counter() - t0)
    return statistics.median(times)


def loopback_link(size_bytes: int, world: int, repeats: int = 5) -> dict:
    """The link as the alpha-beta model sees it: the latency of one call (a 4-byte all-reduce) and the
    bus bandwidth of a large fp32 all-reduce, 2 (N - 1) / N x bytes each rank sends, over the seconds."""
    latency = _median_all_reduce_s(torch.ones(1), 4 * repeats)
    seconds = _median_all_reduce_s(torch.ones(size_bytes // 4), repeats)
    return {"bytes": size_bytes, "seconds": seconds, "bus_bytes_per_s": 2 * (world - 1) / world * size_bytes / seconds,
            "latency_s": latency}


def single(config, args) -> dict:
    """The plain model in one process: the step a data-parallel replica repeats."""
    replica = Replica(config, None, args.batch, args.seq, 0)
    replica.step()
    times = timed_steps(replica, args.warmup, args.steps, synced=False)
    return {"step_s": statistics.median(times), "step_times_s": times, "world": 1}


def main(argv=None) -> None:
    args = parse(argv)
    torch.set_num_threads(1)  # one core per rank: the ranks must not fight over the same cores
    config = ModelConfig.from_file(args.config)
    rank = int(os.environ.get("RANK", "0"))
    alone = single(config, args) if rank == 0 else None  # before the rendezvous: the others sleep in it
    w = dist_util.init_from_env("cpu")
    try:
        layouts = [measure_layout(config, name, args, w.size, w.rank) for name in args.layouts.split(",")]
        bandwidth = loopback_link(args.bandwidth_bytes, w.size)
        if w.rank == 0:
            doc = {"world": w.size, "single": alone, "layouts": layouts, "loopback": bandwidth,
                   "batch": args.batch, "seq": args.seq}
            atomic_write_text(args.out, json.dumps(doc, indent=1) + "\n")
    finally:
        dist_util.shutdown()


if __name__ == "__main__":
    main()
