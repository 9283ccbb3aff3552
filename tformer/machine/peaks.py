"""The course's peak formulas: compute (cores x lanes x 2 x FMA units x clock) and memory bandwidth
(transfer rate x bus width x channels), the Peak record that carries one such figure with its source,
and the reverse question: which clock does a measured FLOP/s imply?"""

from __future__ import annotations

from dataclasses import dataclass

from tformer.core import fmt
from tformer.core.errors import TformerError
from tformer.machine.device import DTYPE_BITS, DTYPES


@dataclass
class Peak:
    """One theoretical figure: value None means unknown or not native; ``source`` says which and why."""

    value: float | None
    unit: str
    source: str


def simd_lanes(simd_bits: int, dtype: str) -> int:
    """Elements of ``dtype`` in one SIMD register of ``simd_bits`` (AVX-512: 16 fp32, 8 fp64)."""
    if dtype not in DTYPE_BITS:
        raise TformerError(f"unknown dtype {dtype!r}; choose one of {', '.join(DTYPES)}")
    return simd_bits // DTYPE_BITS[dtype]


def cpu_peak_flops(cores: int, simd_bits: int | None, fma_units: int, clock_hz: float,
                   dtype: str = "fp32", *, lanes: int | None = None) -> float:
    """Peak = cores x lanes x 2 (an FMA is a multiply and an add) x FMA units x clock.

    ``lanes`` overrides the lanes derived from ``simd_bits`` and the dtype width, for units whose
    lane count is not register width / element width (e.g. AMX tiles).
    """
    if lanes is None:
        if not simd_bits:
            raise TformerError("cpu_peak_flops needs simd_bits or lanes")
        lanes = simd_lanes(simd_bits, dtype)
    for label, value in (("cores", cores), ("lanes", lanes), ("fma_units", fma_units), ("clock_hz", clock_hz)):
        if not value or value <= 0:
            raise TformerError(f"cpu_peak_flops: {label} must be positive, got {value!r}")
    return float(cores) * lanes * 2 * fma_units * float(clock_hz)


def memory_bandwidth(transfer_rate_mt_s: float, bus_width_bits: int = 64, channels: int = 1) -> float:
    """DRAM peak bytes/s = transfers/s x bus width in bytes x channels (DDR4-3200, 2 ch: 51.2e9)."""
    for label, value in (("transfer rate", transfer_rate_mt_s), ("bus width", bus_width_bits), ("channels", channels)):
        if not value or value <= 0:
            raise TformerError(f"memory_bandwidth: {label} must be positive, got {value!r}")
    return float(transfer_rate_mt_s) * 1e6 * bus_width_bits / 8 * channels


def gpu_bandwidth(gbps_per_pin: float, bus_bits: int) -> float:
    """GPU memory peak bytes/s = data rate per pin x bus width / 8 (RTX 3060 Ti: 14 x 256 / 8 = 448 GB/s)."""
    if not gbps_per_pin or gbps_per_pin <= 0 or not bus_bits or bus_bits <= 0:
        raise TformerError(f"gpu_bandwidth: data rate and bus width must be positive, got {gbps_per_pin!r}, {bus_bits!r}")
    return float(gbps_per_pin) * 1e9 * bus_bits / 8


def implied_clock_hz(flops_per_s: float, cores: int, lanes: int, fma_units: int) -> float:
    """The clock at which the peak formula gives ``flops_per_s``: FLOP/s / (cores x lanes x 2 x FMA units).

    A measured rate above the formula's peak means the formula's clock is below the one the cores ran
    at (a VM or /proc reports the nominal clock; the boost clock is higher): this is that clock.
    """
    for label, value in (("cores", cores), ("lanes", lanes), ("fma_units", fma_units)):
        if not value or value <= 0:
            raise TformerError(f"implied_clock_hz: {label} must be positive, got {value!r}")
    return float(flops_per_s) / (float(cores) * lanes * 2 * fma_units)


def above_peak_note(measured: float | None, theoretical: float | None,
                    flops_per_cycle: float | None = None) -> str | None:
    """None unless ``measured`` exceeds ``theoretical``; then one clause saying so, with the clock the
    measurement implies and the one the formula used when ``flops_per_cycle`` (cores x lanes x 2 x FMA
    units) is known. Printed beside every measured/theoretical ratio, so none reads as a bare 115%."""
    if not (fmt.known(measured) and fmt.known(theoretical)) or theoretical <= 0 or measured <= theoretical:
        return None
    if not flops_per_cycle:
        return "measured above the theoretical peak: the spec-derived figure is below what this device reaches"
    return (f"measured above the theoretical peak: it implies a {fmt.hz(measured / flops_per_cycle)} clock, "
            f"the formula used {fmt.hz(theoretical / flops_per_cycle)}, a nominal clock that hides the boost clock")


def vs_theoretical(measured: float | None, theoretical: float | None, flops_per_cycle: float | None = None) -> str:
    """measured / theoretical as a percentage, with ``above_peak_note`` beside it when above 100%."""
    ratio = measured / theoretical if fmt.known(measured) and fmt.known(theoretical) and theoretical else None
    note = above_peak_note(measured, theoretical, flops_per_cycle)
    return fmt.pct(ratio) + (f" ({note})" if note else "")


__all__ = ["Peak", "above_peak_note", "cpu_peak_flops", "gpu_bandwidth", "implied_clock_hz", "memory_bandwidth",
           "simd_lanes", "vs_theoretical"]
