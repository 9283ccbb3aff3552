"""Devices described by the user: a JSON file, inline JSON or key=value pairs (peaks computed by the
course's formulas), a spec-table name, or "measured" (this machine's saved `tformer bench` profile)."""

from __future__ import annotations

import difflib
import os
from dataclasses import fields

from tformer.core.errors import TformerError
from tformer.core.files import parse_json, read_json
from tformer.core.inputs import Bounds, shown
from tformer.core.quant_formats import KEPT_BLOCKS
from tformer.machine.device import DTYPES, Device
from tformer.machine.peaks import cpu_peak_flops, gpu_bandwidth, memory_bandwidth
from tformer.machine.profile_store import load_measured_device
from tformer.machine.spec_table import lookup

_CPU_KEYS = {"cores", "simd_bits", "fma_units", "clock_hz", "clock_ghz", "bf16_native", "fp16_native",
             "int8_native"}
_MEM_KEYS = {"transfer_rate_mt_s", "bus_width_bits", "channels", "gbps_per_pin", "bus_bits"}
_DEVICE_KEYS = {f.name for f in fields(Device)}


HARDWARE_FIX = "describe the device as a JSON object (see `tformer specs`), a table name or 'measured'"


# Any roof, rate or size of a device description: wide enough for a microcontroller and for hardware not yet
# built, narrow enough that times and ridge points made from it stay finite floats.
HARDWARE_NUMBER = Bounds(1e-3, 1e30)


def _positive(key: str, value) -> float:
    where = f"hardware field {key!r}"
    try:
        number = float(value)
    except (TypeError, ValueError):
        raise TformerError(f"{where} must be a number, got {shown(value)}") from None
    except OverflowError:  # an integer of hundreds of digits
        raise HARDWARE_NUMBER.fail(value, where) from None
    return HARDWARE_NUMBER.check(number, where)


def device_from_dict(spec: dict, origin: str = "user description") -> Device:
    """A Device from Device fields and/or CPU and memory fields, peaks computed by the course's formulas.

    Device fields: name, kind, peak_flops {dtype: FLOP/s}, sparse_flops, vector_flops, bandwidth (B/s),
    memory_bytes, notes; flat ``peak_<dtype>`` keys are accepted too (handy on the command line).
    CPU fields: cores, simd_bits, fma_units, clock_hz or clock_ghz, and bf16_native / fp16_native /
    int8_native (true when the CPU has those dot-product instructions). Memory fields:
    transfer_rate_mt_s, bus_width_bits (default 64), channels; or, for a GPU, gbps_per_pin and bus_bits.
    """
    if not isinstance(spec, dict):
        raise TformerError(f"{origin}: a hardware description must be a JSON object, got {type(spec).__name__}")
    spec = dict(spec)
    peak_keys = {k for k in spec if k.startswith("peak_") and k[5:] in DTYPES}
    unknown = set(spec) - _DEVICE_KEYS - _CPU_KEYS - _MEM_KEYS - peak_keys
    if unknown:
        known = sorted(_DEVICE_KEYS | _CPU_KEYS | _MEM_KEYS)
        first = sorted(unknown)[0]
        close = difflib.get_close_matches(first, known, n=1)
        hint = f" (did you mean {close[0]!r}?)" if close else ""
        raise TformerError(f"{origin}: unknown hardware field {first!r}{hint}; known fields: {', '.join(known)}")

    sources: list[str] = []
    peaks: dict[str, float] = {}
    for group in ("peak_flops", "sparse_flops", "vector_flops"):
        value = spec.get(group) or {}
        if not isinstance(value, dict):
            raise TformerError(f"{origin}: {group} must be an object {{dtype: FLOP/s}}")
        bad = set(value) - set(DTYPES)
        if bad:
            raise TformerError(f"{origin}: unknown dtype {sorted(bad)[0]!r} in {group}; choose from {', '.join(DTYPES)}")
    for dtype, value in (spec.get("peak_flops") or {}).items():
        peaks[dtype] = _positive(f"peak_flops.{dtype}", value)
    for key in peak_keys:
        peaks[key[5:]] = _positive(key, spec[key])
    if peaks:
        sources.append("peaks given by the user")

    cpu_given = _CPU_KEYS & set(spec)
    if cpu_given:
        missing = [k for k in ("cores", "simd_bits", "fma_units") if k not in spec]
        if "clock_hz" not in spec and "clock_ghz" not in spec:
            missing.append("clock_ghz")
        if missing:
            raise TformerError(f"{origin}: a CPU needs cores, simd_bits, fma_units and clock_ghz; missing "
                               f"{', '.join(missing)}")
        cores = int(_positive("cores", spec["cores"]))
        simd = int(_positive("simd_bits", spec["simd_bits"]))
        units = int(_positive("fma_units", spec["fma_units"]))
        clock = _positive("clock_hz", spec["clock_hz"]) if "clock_hz" in spec else _positive("clock_ghz", spec["clock_ghz"]) * 1e9
        computed = ["fp64", "fp32"]
        for dtype in ("bf16", "fp16", "int8"):
            if spec.get(f"{dtype}_native"):
                computed.append(dtype)
        for dtype in computed:
            peaks.setdefault(dtype, cpu_peak_flops(cores, simd, units, clock, dtype))
        sources.append(f"computed from {cores} cores x {simd}-bit SIMD lanes x 2 x {units} FMA units x "
                       f"{clock / 1e9:g} GHz")

    bandwidth = spec.get("bandwidth")
    if bandwidth is not None:
        bandwidth = _positive("bandwidth", bandwidth)
        sources.append("bandwidth given by the user")
    elif "transfer_rate_mt_s" in spec:
        rate = _positive("transfer_rate_mt_s", spec["transfer_rate_mt_s"])
        width = int(_positive("bus_width_bits", spec.get("bus_width_bits", 64)))
        channels = int(_positive("channels", spec.get("channels", 1)))
        bandwidth = memory_bandwidth(rate, width, channels)
        sources.append(f"bandwidth computed from {rate:g} MT/s x {width} bit / 8 x {channels} channels")
    elif "gbps_per_pin" in spec or "bus_bits" in spec:
        if "gbps_per_pin" not in spec or "bus_bits" not in spec:
            raise TformerError(f"{origin}: GPU memory needs both gbps_per_pin and bus_bits")
        bandwidth = gpu_bandwidth(_positive("gbps_per_pin", spec["gbps_per_pin"]), int(_positive("bus_bits", spec["bus_bits"])))
        sources.append(f"bandwidth computed from {spec['gbps_per_pin']} Gbps/pin x {spec['bus_bits']} bit / 8")

    memory_bytes = spec.get("memory_bytes")
    if memory_bytes is not None:
        memory_bytes = int(_positive("memory_bytes", memory_bytes))
    kind = spec.get("kind") or ("cpu" if cpu_given else "custom")
    if kind not in ("gpu", "cpu", "tpu", "custom", "measured"):
        raise TformerError(f"{origin}: kind must be gpu, cpu, tpu, custom or measured, got {kind!r}")
    if not peaks and bandwidth is None:
        raise TformerError(f"{origin}: describes no peak and no bandwidth; give peak_flops / peak_fp32=..., "
                           "CPU fields (cores, simd_bits, fma_units, clock_ghz) or bandwidth")
    curve = spec.get("matmul_curve") or {}
    if not isinstance(curve, dict) or any(d not in DTYPES for d in curve):
        raise TformerError(f"{origin}: matmul_curve must be an object {{dtype: [[n, FLOP/s], ...]}}")
    curve = {d: [[_positive("matmul_curve n", n), _positive("matmul_curve FLOP/s", r)] for n, r in pts]
             for d, pts in curve.items()}
    stream_bw = {k: _positive(f"stream_bandwidth.{k}", v) for k, v in (spec.get("stream_bandwidth") or {}).items()}
    gemv_bw = spec.get("gemv_bandwidth") or {}
    gemv_msg = (f"{origin}: gemv_bandwidth must be an object {{dtype or kept block layout ({', '.join(KEPT_BLOCKS)}): "
                "[[rows, k, bytes/s], ...]}}")
    if not isinstance(gemv_bw, dict) or any(d not in DTYPES and d not in KEPT_BLOCKS for d in gemv_bw):
        raise TformerError(gemv_msg)
    try:
        gemv_bw = {d: [[_positive("gemv_bandwidth rows", r), _positive("gemv_bandwidth k", kk),
                        _positive("gemv_bandwidth bytes/s", bw)] for r, kk, bw in pts]
                   for d, pts in gemv_bw.items()}
    except (TypeError, ValueError):
        raise TformerError(gemv_msg) from None
    overhead = spec.get("call_overhead_s")
    return Device.from_roofs(
        str(spec.get("name") or "custom"), kind, peaks,
        matmul_curve=curve, stream_bandwidth=stream_bw, gemv_bandwidth=gemv_bw,
        call_overhead_s=_positive("call_overhead_s", overhead) if overhead is not None else None,
        sparse_flops={k: _positive(k, v) for k, v in (spec.get("sparse_flops") or {}).items()},
        vector_flops={k: _positive(k, v) for k, v in (spec.get("vector_flops") or {}).items()},
        bandwidth=bandwidth, memory_bytes=memory_bytes,
        source=str(spec.get("source") or f"{origin}: " + "; ".join(sources)),
        notes=str(spec.get("notes") or ""),
    )


def parse_pairs(text: str) -> dict:
    """'cores=8,simd_bits=256,fma_units=2,clock_ghz=3' -> dict (numbers stay strings; checked later)."""
    out: dict = {}
    for part in text.split(","):
        if not part.strip():
            continue
        if "=" not in part:
            raise TformerError(f"hardware description {text!r}: expected key=value pairs separated by commas, "
                               f"got {part.strip()!r}")
        key, value = (s.strip() for s in part.split("=", 1))
        if value.lower() in ("true", "yes"):
            out[key] = True
        elif value.lower() in ("false", "no"):
            out[key] = False
        else:
            out[key] = value
    return out


def resolve_hardware(spec: str) -> Device:
    """A Device from a table name or alias, a JSON file, inline JSON, key=value pairs, or "measured".

    "measured" (or "measured:cpu", "measured:cuda:0") is this machine's saved `tformer bench` profile.
    """
    if isinstance(spec, Device):
        return spec
    if not isinstance(spec, str) or not spec.strip():
        raise TformerError("empty hardware name; give a table name (e.g. h100-sxm), a JSON file, or 'measured'")
    text = spec.strip()
    if text == "measured" or text.startswith("measured:"):
        which = text.split(":", 1)[1] if ":" in text else None
        device = load_measured_device(device=which)
        if device is None:
            raise TformerError("no measured profile saved for this machine; run `tformer bench --quick` first")
        return device
    if text.startswith("{"):
        data = parse_json(text, "--hardware JSON", "inline", fix=HARDWARE_FIX)
        return device_from_dict(data, origin="inline JSON")
    if text.endswith(".json") or os.path.sep in text or os.path.isfile(text):
        if not os.path.isfile(text):
            raise TformerError(f"hardware file {text!r} not found")
        data = read_json(text, "hardware file", max_bytes=1 << 20, fix=HARDWARE_FIX)
        return device_from_dict(data, origin=os.path.basename(text))
    if "=" in text:
        return device_from_dict(parse_pairs(text), origin="command-line description")
    return lookup(text)


__all__ = ["device_from_dict", "parse_pairs", "resolve_hardware"]
