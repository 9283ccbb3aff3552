"""FLOP counting that gives the same answer on every supported torch.

The ledger is checked against torch's own FlopCounterMode formulas. Two things make the count depend
on the torch version or on the build, and both are handled here, in one place, so that tests,
``tformer profile`` and the report agree with the ledger on every torch pyproject allows:

- torch before 2.15 has no formula for SDPA's CPU flash kernel
  (``aten._scaled_dot_product_flash_attention_for_cpu`` and its backward): the attention matmuls of
  an SDPA model go uncounted there. The kernel computes exactly what the CUDA flash kernel does, so
  it gets torch's own SDPA formulas (what 2.15 registers for it).
- oneDNN's fused LSTM kernel (``aten.mkldnn_rnn_layer``, CPU builds with oneDNN) has no formula in
  any torch yet. Rather than write one, counting runs the counted path: oneDNN off, so the LSTM
  runs as the per-step matmuls FlopCounterMode sees. FLOPs do not depend on the kernel.

    from tformer.measure.flops import FlopCounter
    with torch.no_grad(), FlopCounter() as fc:
        model(ids)
    fc.get_total_flops()
"""

from __future__ import annotations

import contextlib

import torch
from torch.utils import flop_counter
from torch.utils.flop_counter import FlopCounterMode

aten = torch.ops.aten


def _missing_formulas() -> dict:
    """The formulas this torch lacks for kernels tformer runs (torch's own formulas, mapped to them)."""
    have = flop_counter.flop_registry
    missing = {}
    # Before torch 2.15: SDPA's CPU flash kernel, forward and backward (same argument order as the
    # CUDA flash kernel's: query, key, value first; grad_out first in the backward).
    cpu_flash = getattr(aten, "_scaled_dot_product_flash_attention_for_cpu", None)
    if cpu_flash is not None and cpu_flash not in have:
        missing[cpu_flash] = have[aten._scaled_dot_product_flash_attention]
    cpu_flash_bw = getattr(aten, "_scaled_dot_product_flash_attention_for_cpu_backward", None)
    if cpu_flash_bw is not None and cpu_flash_bw not in have:
        missing[cpu_flash_bw] = have[aten._scaled_dot_product_flash_attention_backward]
    return missing


MISSING = _missing_formulas()
# Every formula, keyed by op packet, called with the op's real arguments (tensors, not shapes).
FORMULAS = {**flop_counter.flop_registry, **MISSING}


@contextlib.contextmanager
def counted_path():
    """The context in which every op tformer runs has a formula: oneDNN's fused RNN kernel off."""
    # Only the one switch (mkldnn.flags() would also reset the TF32 setting, and warn on CPU-only builds).
    was = torch.backends.mkldnn.enabled
    torch.backends.mkldnn.enabled = False
    try:
        yield
    finally:
        torch.backends.mkldnn.enabled = was


class FlopCounter(FlopCounterMode):
    """torch's FlopCounterMode, with the formulas this torch lacks, on the counted path; quiet by default."""

    def __init__(self, display: bool = False, depth: int = 2):
        # The registry's entries already take tensors; marked raw so FlopCounterMode does not wrap them twice.
        super().__init__(display=display, depth=depth, custom_mapping={k: _raw(v) for k, v in MISSING.items()})
        self._path = contextlib.ExitStack()

    def __enter__(self):
        self._path.enter_context(counted_path())
        try:
            return super().__enter__()
        except BaseException:
            self._path.close()
            raise

    def __exit__(self, *exc):
        try:
            return super().__exit__(*exc)
        finally:
            self._path.close()


def _raw(formula):
    def call(*args, **kwargs):
        return formula(*args, **kwargs)

    call._get_raw = True
    return call


def count_flops(fn, *args, **kwargs) -> int:
    """FLOPs of one call of ``fn`` (no gradient), counted by FlopCounter."""
    with torch.no_grad(), FlopCounter() as fc:
        fn(*args, **kwargs)
    return fc.get_total_flops()


__all__ = ["FORMULAS", "MISSING", "FlopCounter", "count_flops", "counted_path"]
