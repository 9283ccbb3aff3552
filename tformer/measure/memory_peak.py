"""Peak tensor memory of a call, on any device: the most bytes of tensors the call itself allocated
that were alive at one time, above whatever existed before it.

On a CPU there is no allocator counter to read, so ``PeakTensorMemory`` watches every op PyTorch
dispatches (a TorchDispatchMode, which sees the backward pass's ops too): each output whose storage
is new (not one of the op's inputs' storages, so views and in-place results are not counted twice)
adds its storage's bytes, and a weakref finalizer on that storage takes them off when it is freed.
What it cannot see: scratch memory a kernel allocates and frees inside itself (the fused attention
kernel's per-thread tiles, BLAS packing buffers). On a GPU, ``peak_bytes`` reads the CUDA allocator's
own peak instead, which sees those too.
"""

from __future__ import annotations

import weakref

import torch
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_flatten


def _storages(tree):
    for t in tree_flatten(tree)[0]:
        if isinstance(t, torch.Tensor):
            yield t.untyped_storage()


class PeakTensorMemory(TorchDispatchMode):
    """``with PeakTensorMemory() as m: f()`` then ``m.peak`` (bytes) and ``m.live`` (still held at the end)."""

    def __init__(self):
        super().__init__()
        self._held: dict[int, int] = {}  # storage address -> bytes, for storages allocated inside
        self.live = 0
        self.peak = 0

    def _freed(self, key: int) -> None:
        self.live -= self._held.pop(key, 0)

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        inputs = {s.data_ptr() for s in _storages((args, kwargs))}
        for storage in _storages(out):
            key, size = storage.data_ptr(), storage.nbytes()
            if size == 0 or key in inputs or key in self._held:
                continue  # a view, an in-place result, or a storage already counted
            self._held[key] = size
            self.live += size
            self.peak = max(self.peak, self.live)
            weakref.finalize(storage, self._freed, key)
        return out


def peak_bytes(fn, device: str = "cpu") -> int:
    """Peak bytes of tensors ``fn()`` allocates, above what was allocated before the call."""
    if device.startswith("cuda"):
        torch.cuda.synchronize(device)
        before = torch.cuda.memory_allocated(device)
        torch.cuda.reset_peak_memory_stats(device)
        fn()
        torch.cuda.synchronize(device)
        return max(0, torch.cuda.max_memory_allocated(device) - before)
    with PeakTensorMemory() as tracker:
        fn()
    return tracker.peak


__all__ = ["PeakTensorMemory", "peak_bytes"]
