"""torchrun support: process group from the environment, DDP wrapping, cross-rank reductions."""

from __future__ import annotations

import os
from dataclasses import dataclass

import torch
import torch.distributed as dist


@dataclass
class World:
    rank: int
    size: int
    local_rank: int


def world() -> World:
    if dist.is_available() and dist.is_initialized():
        return World(dist.get_rank(), dist.get_world_size(), int(os.environ.get("LOCAL_RANK", 0)))
    return World(0, 1, 0)


def init_from_env(device: str) -> World:
    """Join the process group torchrun describes (gloo on CPU, NCCL on GPU); no-op for one process."""
    if int(os.environ.get("WORLD_SIZE", "1")) > 1 and not dist.is_initialized():
        backend = "nccl" if device.startswith("cuda") else "gloo"
        dist.init_process_group(backend)
        if device.startswith("cuda"):
            torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", 0)))
    return world()


def wrap_ddp(model, device: torch.device):
    # deferred: torch.distributed loads only for distributed runs
    from torch.nn.parallel import DistributedDataParallel

    ids = [device.index] if device.type == "cuda" else None
    # Gradients as views into DDP's all-reduce buckets: otherwise every gradient is held twice during
    # backward (the .grad tensors and the bucket copies), and the ledger's per-device bytes would be short.
    return DistributedDataParallel(model, device_ids=ids, gradient_as_bucket_view=True)


def freeze_unreached(model, prefixes: tuple[str, ...]) -> None:
    """Stop asking for gradients of the parameters the loss never reaches (the runner's loss_skips:
    BERT's pooler under the masked-token loss). They would get none anyway; DDP waits for every
    parameter that requires one and fails the next step, since the pooler's output is still returned."""
    for name, p in model.named_parameters():
        if name.startswith(prefixes):
            p.requires_grad_(False)


def mean(value: torch.Tensor) -> torch.Tensor:
    if world().size > 1:
        value = value.clone()
        dist.all_reduce(value, op=dist.ReduceOp.SUM)
        value /= world().size
    return value


def any_rank(flag: bool, device) -> bool:
    """True on every rank when ``flag`` is True on at least one."""
    if world().size == 1:
        return flag
    t = torch.tensor([1.0 if flag else 0.0], device=device)
    dist.all_reduce(t, op=dist.ReduceOp.MAX)
    return bool(t.item() > 0)


def sum_pair(total: float, count: int, device) -> tuple[float, int]:
    if world().size == 1:
        return total, count
    t = torch.tensor([total, float(count)], dtype=torch.float64, device=device)
    dist.all_reduce(t, op=dist.ReduceOp.SUM)
    return float(t[0]), int(t[1])


def shutdown() -> None:
    if dist.is_available() and dist.is_initialized():
        dist.destroy_process_group()
