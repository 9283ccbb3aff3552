"""torchrun support: process group from the environment, DDP wrapping, cross-rank reductions, and a teardown that
cannot hang.

Why the teardown needs care (gloo, CPU): a collective's tensors are held by its work object, which the process
group's worker thread destroys after the work completes, a moment after the caller's wait returned. If Python has
dropped the tensor by then, the work holds its last reference, and destroying it means releasing the Python object:
the worker must take the GIL. The process group's destructor joins its worker threads while holding the GIL (it
runs when the last Python reference to the group goes: destroy_process_group, or DDP's Reducer at exit). A worker
that reached its last work's destructor after that point waits for the GIL forever, and the rank never exits: three
of five two-rank DDP runs here on two loaded cores (py-spy: the main thread in ProcessGroupGloo::~ProcessGroupGloo ->
std::thread::join, a worker in AsyncAllreduceWork::~AsyncAllreduceWork -> gil_scoped_acquire). So every tensor
tformer hands to a collective stays referenced here (the last HELD of them), so a worker never releases its Python
object; and ``shutdown`` meets the other ranks at a barrier, whose call releases the GIL while the workers finish
what they hold, before the group is destroyed.
"""

from __future__ import annotations

import os
from collections import deque
from dataclasses import dataclass

import torch
import torch.distributed as dist


HELD = 16  # the most recent collectives' tensors kept referenced: more than a group's workers can hold at once
_held: deque = deque(maxlen=HELD)


def _all_reduce(t: torch.Tensor, op) -> torch.Tensor:
    """``dist.all_reduce`` whose tensor outlives the work object (see the module docstring)."""
    _held.append(t)
    dist.all_reduce(t, op=op)
    return t


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
        value = _all_reduce(value.detach().clone(), dist.ReduceOp.SUM) / world().size
    return value


def any_rank(flag: bool, device) -> bool:
    """True on every rank when ``flag`` is True on at least one."""
    if world().size == 1:
        return flag
    t = _all_reduce(torch.tensor([1.0 if flag else 0.0], device=device), dist.ReduceOp.MAX)
    return bool(t.item() > 0)


def sum_pair(total: float, count: int, device) -> tuple[float, int]:
    if world().size == 1:
        return total, count
    t = _all_reduce(torch.tensor([total, float(count)], dtype=torch.float64, device=device), dist.ReduceOp.SUM)
    return float(t[0]), int(t[1])


def shutdown() -> None:
    """Leave the process group: every rank at a barrier (called with the GIL released, so workers finish destroying
    what they hold), then the group destroyed. Call it on every rank, after its last collective."""
    if dist.is_available() and dist.is_initialized():
        dist.barrier()
        dist.destroy_process_group()
    # _held is not cleared: the group itself may outlive this call (DDP's Reducer holds it until the model goes),
    # and its workers must never be the last holders of a tensor Python created.
