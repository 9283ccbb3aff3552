"""Devices: peak compute and memory bandwidth, each number with its source."""

from __future__ import annotations

from dataclasses import dataclass, field

DTYPES = ("fp64", "fp32", "tf32", "fp16", "bf16", "fp8", "int8")


@dataclass
class Device:
    """A device's roofs. A peak that is not known is absent/None: never another device's number."""

    name: str
    kind: str  # "gpu" | "cpu" | "tpu" | "custom" | "measured"
    peak_flops: dict[str, float] = field(default_factory=dict)  # dtype -> dense FLOP/s (FLOPs = 2 x MACs)
    sparse_flops: dict[str, float] = field(default_factory=dict)  # dtype -> FLOP/s with 2:4 sparsity
    bandwidth: float | None = None  # bytes/s to main memory (HBM / DRAM)
    memory_bytes: int | None = None
    source: str = "unknown"  # where the numbers come from: "spec table: ...", "computed from ...", "measured ..."
    notes: str = ""

    def peak(self, dtype: str) -> float | None:
        return self.peak_flops.get(dtype)

    def ridge_point(self, dtype: str) -> float | None:
        """FLOPs per byte at which compute and bandwidth roofs meet."""
        peak = self.peak(dtype)
        if peak is None or not self.bandwidth:
            return None
        return peak / self.bandwidth
