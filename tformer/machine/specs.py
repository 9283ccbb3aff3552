"""What this machine is: CPU, caches, memory, GPUs, and the theoretical peaks that follow from them.

Every probe is guarded: a file that does not exist (containers, macOS), a tool that is missing
(lscpu, dmidecode, nvidia-smi), a library that is not installed (pynvml) or a GPU that is absent
leaves the field None / "unknown" and never raises. Every theoretical number carries its source:
"computed from ...", "spec table: ..." or "unknown". GPU records and peaks are in
tformer.machine.gpu_specs. Nothing here imports torch: the GPUs PyTorch sees and the PyTorch build
are probed in tformer.measure.probe and passed to ``detect`` (``tformer.measure.probe.detect_machine``
does both).
"""

from __future__ import annotations

import os
import platform
import re
import shutil
import subprocess
from dataclasses import asdict, dataclass, field

from tformer.core import fmt
from tformer.machine.device import Device, GiB
from tformer.machine.gpu_specs import GPUInfo, gpu_peaks
from tformer.machine.peaks import Peak, cpu_peak_flops, memory_bandwidth
from tformer.machine.spec_table import lookup, match_gpu_name

# Flags worth showing: SIMD width, FMA, and the low-precision dot-product / matrix instructions that
# decide whether bf16, fp16 and int8 are native or emulated.
INTERESTING_FLAGS = ("sse4_2", "avx", "avx2", "fma", "avx512f", "avx512_vnni", "avx_vnni", "avx512_bf16",
                     "avx512_fp16", "amx_tile", "amx_bf16", "amx_int8", "amx_fp16",
                     "asimd", "neon", "asimdhp", "asimddp", "bf16", "i8mm", "sve", "sve2")

NO_NATIVE = "no native support: emulated"


def _read(path: str) -> str | None:
    try:
        with open(path, encoding="utf-8", errors="replace") as fh:
            return fh.read()
    except OSError:
        return None


def _run(cmd: list[str], timeout: float = 3.0) -> str | None:
    """Output of a helper tool, or None when it is missing, fails or hangs."""
    if not shutil.which(cmd[0]):
        return None
    try:
        done = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, check=False)
    except (OSError, subprocess.SubprocessError):
        return None
    return done.stdout if done.returncode == 0 else None


@dataclass
class Cache:
    level: int
    type: str
    size_bytes: int | None
    shared_cpu_list: str | None = None


@dataclass
class CPUInfo:
    model: str = "unknown"
    vendor: str = "unknown"
    arch: str = ""
    family: int | None = None
    model_id: int | None = None
    physical_cores: int | None = None
    logical_cpus: int | None = None
    usable_cpus: int | None = None  # CPUs this process may run on (affinity): containers often restrict it
    sockets: int | None = None
    flags: dict[str, bool] = field(default_factory=dict)
    base_clock_hz: float | None = None
    max_clock_hz: float | None = None
    current_clock_hz: float | None = None
    clock_source: str = "unknown"
    caches: list[Cache] = field(default_factory=list)
    hypervisor: bool = False
    simd_bits: int | None = None
    fma_units: int | None = None
    vector_source: str = "unknown"  # why we believe simd_bits / fma_units


@dataclass
class MemoryInfo:
    total_bytes: int | None = None
    type: str = "unknown"
    speed_mt_s: float | None = None
    channels: int | None = None
    source: str = "unknown"


@dataclass
class MachineSpecs:
    cpu: CPUInfo
    memory: MemoryInfo
    gpus: list[GPUInfo]
    cpu_peaks: dict[str, Peak]
    cpu_bandwidth: Peak
    gpu_peaks: dict[int, dict[str, Peak]]  # index -> {"fp16_tensor": Peak, "fp32": Peak, ..., "bandwidth": Peak}
    torch: dict
    os: str
    notes: list[str] = field(default_factory=list)

    def to_dict(self) -> dict:
        data = asdict(self)
        data["gpu_peaks"] = {str(k): v for k, v in data["gpu_peaks"].items()}
        return data

    def cpu_device(self) -> Device:
        """The CPU's theoretical roofs as a Device (only numeric peaks; emulated dtypes stay absent)."""
        return Device.from_roofs(
            self.cpu.model, "cpu", {d: p.value for d, p in self.cpu_peaks.items()},
            bandwidth=self.cpu_bandwidth.value, memory_bytes=self.memory.total_bytes,
            source="; ".join(sorted({p.source for p in self.cpu_peaks.values() if p.value})) or "unknown")

    def gpu_device(self, index: int) -> Device:
        """A GPU's theoretical roofs: the spec-table entry when the name matches one, else what was computed."""
        gpu = self.gpus[index]
        if gpu.table_entry:
            return lookup(gpu.table_entry)
        peaks = self.gpu_peaks.get(index, {})
        fp32 = peaks.get("fp32")
        bw = peaks.get("bandwidth")
        return Device.from_roofs(gpu.name, "gpu", {"fp32": fp32.value if fp32 else None},
                                 bandwidth=bw.value if bw else None, memory_bytes=gpu.memory_bytes,
                                 source=fp32.source if fp32 else "unknown",
                                 notes="not in the spec table: tensor-core peaks unknown")


# --------------------------------------------------------------------------------------------
# CPU
# --------------------------------------------------------------------------------------------

def _parse_cpuinfo(text: str) -> tuple[dict[str, str], set[str], int | None]:
    """First processor block as a dict, the flag set, and the number of distinct physical cores."""
    first: dict[str, str] = {}
    cores: set[tuple[str, str]] = set()
    block: dict[str, str] = {}
    for line in text.splitlines() + [""]:
        if not line.strip():
            if block:
                if not first:
                    first = block
                if "physical id" in block and "core id" in block:
                    cores.add((block["physical id"], block["core id"]))
            block = {}
            continue
        if ":" in line:
            key, value = line.split(":", 1)
            block.setdefault(key.strip().lower(), value.strip())
    flags = set((first.get("flags") or first.get("features") or "").split())
    return first, flags, (len(cores) or None)


def _parse_lscpu(text: str) -> dict[str, str]:
    out = {}
    for line in text.splitlines():
        if ":" in line:
            key, value = line.split(":", 1)
            out[key.strip().lower()] = value.strip()
    return out


def _int(value) -> int | None:
    try:
        return int(str(value).strip(), 0)
    except (TypeError, ValueError):
        try:
            return int(float(value))
        except (TypeError, ValueError):
            return None


def _size_bytes(text: str | None) -> int | None:
    if not text:
        return None
    m = re.match(r"\s*([\d.]+)\s*([KMG]?)", text.strip(), re.I)
    if not m:
        return None
    return int(float(m.group(1)) * {"": 1, "K": 2**10, "M": 2**20, "G": 2**30}[m.group(2).upper()])


def _caches() -> list[Cache]:
    base = "/sys/devices/system/cpu/cpu0/cache"
    out = []
    try:
        names = sorted(n for n in os.listdir(base) if n.startswith("index"))
    except OSError:
        return out
    for name in names:
        level = _int(_read(f"{base}/{name}/level"))
        if level is None:
            continue
        out.append(Cache(level=level, type=(_read(f"{base}/{name}/type") or "?").strip(),
                         size_bytes=_size_bytes(_read(f"{base}/{name}/size")),
                         shared_cpu_list=(_read(f"{base}/{name}/shared_cpu_list") or "").strip() or None))
    return out


def vector_units(cpu: CPUInfo) -> tuple[int | None, int | None, str]:
    """SIMD width and FMA units per core, inferred from the ISA flags and the CPU family.

    The flags give the register width; how many FMA pipes a core has is not in any flag, so it comes
    from what the vendors document for each microarchitecture, and the text says it is an assumption
    (override with --fma-units / --simd-bits).
    """
    f = cpu.flags
    name = cpu.model.lower()
    if cpu.arch in ("x86_64", "amd64", "i686", "i386") or f.get("sse4_2"):
        simd = 512 if f.get("avx512f") else 256 if f.get("avx") else 128
        if "amd" in cpu.vendor.lower():
            fam, mod = cpu.family or 0, cpu.model_id or 0
            if fam >= 26 and f.get("avx512f"):
                if "ryzen ai" in name:
                    return 512, 1, "assumed: Zen 5 mobile runs 512-bit FMAs on 256-bit pipes (one per cycle)"
                return 512, 2, f"assumed: AMD family {fam} (Zen 5) has two full-width 512-bit FMA pipes"
            if fam == 25 and f.get("avx512f"):
                return 512, 1, "assumed: Zen 4 splits a 512-bit FMA over its two 256-bit pipes (one per cycle)"
            if fam == 25 or (fam == 23 and mod >= 0x30):
                return 256, 2, f"assumed: AMD family {fam} (Zen 2/3) has two 256-bit FMA pipes"
            if fam == 23:
                return 128, 2, "assumed: Zen/Zen+ have two 128-bit FMA pipes (a 256-bit op takes both)"
            return simd, 1, f"assumed: unknown AMD family {fam}, one {simd}-bit FMA unit"
        if "intel" in cpu.vendor.lower():
            if f.get("avx512f"):
                if re.search(r"xeon.*(bronze|silver|gold 5\d\d\d)", name):
                    return 512, 1, "assumed: Xeon Bronze/Silver/Gold 5xxx have one 512-bit FMA unit"
                if "xeon" in name:
                    return 512, 2, "assumed: Xeon Gold 6xxx/Platinum/Max and later have two 512-bit FMA units"
                return 512, 1, "assumed: client cores with AVX-512 have one 512-bit FMA unit (two fused 256-bit)"
            if f.get("fma"):
                return 256, 2, "assumed: two 256-bit FMA units (Haswell and later)"
            if f.get("avx"):
                return 256, 1, "assumed: no FMA; one 256-bit multiply + one add per cycle (counted as one FMA)"
            return 128, 1, "assumed: SSE only"
        return simd, 1, f"assumed: unknown x86 vendor {cpu.vendor!r}, one {simd}-bit FMA unit"
    if cpu.arch in ("aarch64", "arm64") or f.get("asimd") or f.get("neon"):
        if "apple" in name:
            return 128, 4, "assumed: Apple M-series performance cores have four 128-bit FMA pipes"
        if f.get("sve"):
            vl = _int(_read("/proc/sys/abi/sve_default_vector_length"))
            bits = vl * 8 if vl else None
            if bits:
                return bits, 2, f"assumed: SVE vector length {bits} bits (from /proc), two FMA pipes"
        return 128, 2, "assumed: two 128-bit NEON FMA pipes (Neoverse N1 / Cortex-A7x class)"
    return None, None, "unknown: architecture not recognised"


def usable_cpus() -> int:
    """CPUs this process may run on (its affinity mask; every logical CPU where there is none)."""
    try:
        return len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        return os.cpu_count() or 1


def cpu_info() -> CPUInfo:
    """The CPU as /proc, /sys, lscpu (and sysctl on macOS) describe it; unknown fields stay None."""
    cpu = CPUInfo(arch=platform.machine().lower())
    cpu.logical_cpus = os.cpu_count()
    cpu.usable_cpus = usable_cpus()
    flagset: set[str] = set()
    text = _read("/proc/cpuinfo")
    if text:
        first, flagset, phys = _parse_cpuinfo(text)
        cpu.model = first.get("model name") or first.get("hardware") or first.get("processor", "unknown")
        cpu.vendor = first.get("vendor_id") or ("ARM implementer " + first["cpu implementer"]
                                                if "cpu implementer" in first else "unknown")
        cpu.family = _int(first.get("cpu family"))
        cpu.model_id = _int(first.get("model"))
        cpu.physical_cores = phys
        mhz = first.get("cpu mhz")
        if mhz:
            try:
                cpu.current_clock_hz = float(mhz) * 1e6
            except ValueError:
                pass
    lscpu = _run(["lscpu"])
    if lscpu:
        info = _parse_lscpu(lscpu)
        if cpu.model in ("unknown", "") and info.get("model name"):
            cpu.model = info["model name"]
        if cpu.vendor == "unknown" and info.get("vendor id"):
            cpu.vendor = info["vendor id"]
        cps, sockets = _int(info.get("core(s) per socket")), _int(info.get("socket(s)"))
        cpu.sockets = sockets
        if cpu.physical_cores is None and cps and sockets:
            cpu.physical_cores = cps * sockets
        if info.get("cpu max mhz"):
            try:
                cpu.max_clock_hz = float(info["cpu max mhz"]) * 1e6
                cpu.clock_source = "lscpu CPU max MHz"
            except ValueError:
                pass
        if not flagset and info.get("flags"):
            flagset = set(info["flags"].split())
    if platform.system() == "Darwin":  # no /proc on macOS: sysctl knows the same things
        brand = _run(["sysctl", "-n", "machdep.cpu.brand_string"])
        if brand:
            cpu.model = brand.strip()
            cpu.vendor = "Apple" if "apple" in brand.lower() else cpu.vendor
        cpu.physical_cores = _int(_run(["sysctl", "-n", "hw.physicalcpu"])) or cpu.physical_cores
        for key, flag in (("hw.optional.arm.FEAT_BF16", "bf16"), ("hw.optional.arm.FEAT_DotProd", "asimddp"),
                          ("hw.optional.neon", "asimd"), ("hw.optional.avx2_0", "avx2"),
                          ("hw.optional.avx512f", "avx512f")):
            if (_run(["sysctl", "-n", key]) or "").strip() == "1":
                flagset.add(flag)
    cpu.flags = {name: name in flagset for name in INTERESTING_FLAGS}
    cpu.hypervisor = "hypervisor" in flagset
    # Clocks: cpufreq is the authority where the kernel exposes it (bare metal); VMs often hide it.
    freq = "/sys/devices/system/cpu/cpu0/cpufreq"
    fmax = _int(_read(f"{freq}/cpuinfo_max_freq"))
    if fmax:
        cpu.max_clock_hz, cpu.clock_source = fmax * 1e3, "cpufreq cpuinfo_max_freq"
    fbase = _int(_read(f"{freq}/base_frequency"))
    if fbase:
        cpu.base_clock_hz = fbase * 1e3
    m = re.search(r"@\s*([\d.]+)\s*GHz", cpu.model)
    if m and cpu.base_clock_hz is None:
        cpu.base_clock_hz = float(m.group(1)) * 1e9  # Intel names carry the base clock
    cpu.caches = _caches()
    cpu.simd_bits, cpu.fma_units, cpu.vector_source = vector_units(cpu)
    return cpu


def available_memory_bytes() -> int | None:
    """Memory the OS can give a new allocation now (Linux MemAvailable), None where it does not say."""
    text = _read("/proc/meminfo")
    m = re.search(r"MemAvailable:\s+(\d+)\s*kB", text or "")
    if m:
        return int(m.group(1)) * 1024
    return None


def _memory_info(memory_mt_s: float | None, channels: int | None) -> MemoryInfo:
    mem = MemoryInfo()
    text = _read("/proc/meminfo")
    if text:
        m = re.search(r"MemTotal:\s+(\d+)\s*kB", text)
        if m:
            mem.total_bytes = int(m.group(1)) * 1024
    elif platform.system() == "Darwin":
        mem.total_bytes = _int(_run(["sysctl", "-n", "hw.memsize"]))
    # DIMM type and speed are in the SMBIOS tables, readable only by root through dmidecode.
    dmi = _run(["dmidecode", "-t", "17"])
    if dmi:
        types = re.findall(r"^\s*Type:\s*(DDR\S*|LPDDR\S*|HBM\S*)", dmi, re.M)
        speeds = re.findall(r"Configured (?:Memory|Clock) Speed:\s*(\d+)\s*MT/s", dmi) or \
            re.findall(r"^\s*Speed:\s*(\d+)\s*MT/s", dmi, re.M)
        if types:
            mem.type = types[0]
        if speeds:
            mem.speed_mt_s = float(min(int(s) for s in speeds))
        mem.source = "dmidecode -t 17"
    else:
        mem.source = "/proc/meminfo (type and speed need dmidecode as root: unknown)"
    if memory_mt_s:
        mem.speed_mt_s, mem.source = float(memory_mt_s), mem.source + "; speed given by the user"
    if channels:
        mem.channels = int(channels)
    return mem


def _clock_for_peak(cpu: CPUInfo, override_hz: float | None) -> tuple[float | None, str]:
    if override_hz:
        return override_hz, "clock given by the user"
    if cpu.max_clock_hz:
        return cpu.max_clock_hz, f"max clock ({cpu.clock_source})"
    if cpu.base_clock_hz:
        return cpu.base_clock_hz, "base clock (model name); turbo may exceed it"
    if cpu.current_clock_hz:
        return cpu.current_clock_hz, ("/proc/cpuinfo 'cpu MHz' (max clock not readable"
                                      + (", a hypervisor reports the nominal clock" if cpu.hypervisor else "") + ")")
    return None, "clock unknown"


def _peak_cores(cpu: CPUInfo) -> int | None:
    cores = cpu.physical_cores or cpu.logical_cpus
    if cpu.usable_cpus and cores and cpu.usable_cpus < cores:
        cores = cpu.usable_cpus  # this process cannot use the others
    return cores


# Why a dtype has no peak on a CPU without the instructions for it.
_NOT_NATIVE = {
    "bf16": f"{NO_NATIVE} (no avx512_bf16/AMX/ARM bf16: bf16 is converted to fp32, so expect fp32 speed at best)",
    "fp16": f"{NO_NATIVE} (no avx512_fp16/AMX-FP16: F16C only converts to fp32)",
    "int8": f"{NO_NATIVE} (no VNNI/AMX/dot-product instructions)",
}


def cpu_units(cpu: CPUInfo, dtype: str) -> tuple[int, int, str] | None:
    """(lanes, FMA units, which unit) that compute ``dtype`` on one core; None when not native or undetected.

    bf16: AMX tiles (1024 bf16 MACs/cycle/core on Sapphire Rapids), or a bf16 dot-product instruction
    (avx512_bf16 VDPBF16PS, ARM BFDOT) that does two bf16 products per fp32 lane. AMX "lanes" are the
    tile unit's MACs per cycle, so lanes x 2 x units stays the FLOPs per cycle per core.
    """
    f, simd, units = cpu.flags, cpu.simd_bits, cpu.fma_units
    if not (simd and units):
        return None
    isa = {512: "AVX-512", 256: "AVX2", 128: "SSE/NEON"}.get(simd, f"{simd}-bit SIMD")
    if dtype in ("fp64", "fp32"):
        return simd // (64 if dtype == "fp64" else 32), units, isa
    if dtype == "bf16":
        if f.get("amx_bf16"):
            return 1024, 1, "AMX-BF16 tile unit"
        if f.get("avx512_bf16") or f.get("bf16"):
            return simd // 16, units, "avx512_bf16 VDPBF16PS" if f.get("avx512_bf16") else "ARM BFDOT"
    if dtype == "fp16":
        if f.get("amx_fp16"):
            return 1024, 1, "AMX-FP16"
        if f.get("avx512_fp16") or f.get("asimdhp"):
            return simd // 16, units, "avx512_fp16" if f.get("avx512_fp16") else "NEON fp16"
    if dtype == "int8":
        if f.get("amx_int8"):
            return 2048, 1, "AMX-INT8"
        if f.get("avx512_vnni") or f.get("avx_vnni") or f.get("asimddp"):
            bits = simd if f.get("avx512_vnni") or not f.get("avx_vnni") else 256
            return bits // 8, units, "VNNI VPDPBUSD" if not f.get("asimddp") else "ARM SDOT"
    return None


def cpu_flops_per_cycle(cpu: CPUInfo, dtype: str) -> float | None:
    """cores x lanes x 2 x FMA units for ``dtype``: the peak formula without its clock (None when unknown).
    A measured FLOP/s divided by it is the clock the measurement implies (peaks.implied_clock_hz)."""
    cores, units = _peak_cores(cpu), cpu_units(cpu, dtype)
    if not (cores and units):
        return None
    lanes, fma, _ = units
    return float(cores) * lanes * 2 * fma


def cpu_peaks(cpu: CPUInfo, clock_override_hz: float | None = None) -> dict[str, Peak]:
    """Theoretical FLOP/s per dtype for the CPU, or why there is none."""
    clock, clock_why = _clock_for_peak(cpu, clock_override_hz)
    cores = _peak_cores(cpu)
    out: dict[str, Peak] = {}
    for dtype in ("fp64", "fp32", "bf16", "fp16", "int8"):
        unit = "OPS" if dtype == "int8" else "FLOP/s"
        if not (clock and cores and cpu.simd_bits and cpu.fma_units):
            out[dtype] = Peak(None, unit, "unknown: cores, SIMD width, FMA units or clock not detected")
            continue
        found = cpu_units(cpu, dtype)
        if found is None:
            out[dtype] = Peak(None, unit, _NOT_NATIVE[dtype])
            continue
        lanes, units, what = found
        value = cpu_peak_flops(cores, None, units, clock, dtype, lanes=lanes)
        if what.startswith("AMX"):
            how = f"{lanes} {dtype} MACs/cycle ({what}) x 2"
        else:
            how = f"{lanes} {dtype} lanes ({what}) x 2 x {units} FMA units ({cpu.vector_source})"
        out[dtype] = Peak(value, unit, f"computed from {cores} cores x {how} x {fmt.hz(clock)} ({clock_why})")
    return out


def _cpu_bandwidth(mem: MemoryInfo, bus_bits: int) -> Peak:
    if mem.speed_mt_s and mem.channels:
        value = memory_bandwidth(mem.speed_mt_s, bus_bits, mem.channels)
        return Peak(value, "B/s", f"computed from {mem.speed_mt_s:g} MT/s x {bus_bits} bit / 8 x {mem.channels} channels")
    missing = [w for w, v in (("transfer rate", mem.speed_mt_s), ("channel count", mem.channels)) if not v]
    return Peak(None, "B/s", f"unknown: memory {' and '.join(missing)} not readable here "
                             "(give --memory-mts and --memory-channels)")


# --------------------------------------------------------------------------------------------

def detect(*, gpus: list[GPUInfo] | None = None, torch_info: dict | None = None, clock_ghz: float | None = None,
           fma_units: int | None = None, simd_bits: int | None = None, memory_mt_s: float | None = None,
           memory_channels: int | None = None, memory_bus_bits: int = 64) -> MachineSpecs:
    """Everything readable about this machine without torch, plus theoretical peaks with their sources.

    ``gpus`` and ``torch_info`` are what PyTorch sees (probed by tformer.measure.probe; none given:
    no GPUs, an empty torch entry). The other keyword arguments override what cannot be detected (or
    was guessed): they are the inputs of the course's formulas.
    """
    cpu = cpu_info()
    if simd_bits:
        cpu.simd_bits, cpu.vector_source = int(simd_bits), "SIMD width given by the user"
    if fma_units:
        cpu.fma_units = int(fma_units)
        cpu.vector_source = "FMA units given by the user" + (f", {cpu.vector_source}" if simd_bits else "")
    mem = _memory_info(memory_mt_s, memory_channels)
    gpus = list(gpus or [])
    for g in gpus:
        g.table_entry = g.table_entry or match_gpu_name(g.name, g.memory_bytes)
    notes = []
    if cpu.hypervisor:
        notes.append("running under a hypervisor: vCPUs may be SMT siblings sharing one core's FMA units, and "
                     "the reported clock is nominal; measured peaks can fall well below the formula")
    if cpu.usable_cpus and cpu.logical_cpus and cpu.usable_cpus < cpu.logical_cpus:
        notes.append(f"this process may use {cpu.usable_cpus} of {cpu.logical_cpus} CPUs (affinity)")
    specs = MachineSpecs(
        cpu=cpu, memory=mem, gpus=gpus,
        cpu_peaks=cpu_peaks(cpu, clock_ghz * 1e9 if clock_ghz else None),
        cpu_bandwidth=_cpu_bandwidth(mem, memory_bus_bits),
        gpu_peaks={g.index: gpu_peaks(g) for g in gpus},
        torch=dict(torch_info or {}),
        os=f"{platform.system()} {platform.release()}",
        notes=notes,
    )
    return specs


def last_level_cache_bytes(specs: MachineSpecs | None = None) -> int | None:
    caches = (specs.cpu.caches if specs else _caches())
    sizes = [c.size_bytes for c in caches if c.size_bytes and c.type.lower() in ("unified", "data")]
    return max(sizes) if sizes else None


__all__ = ["NO_NATIVE", "Cache", "CPUInfo", "MachineSpecs", "MemoryInfo", "Peak", "GiB", "cpu_flops_per_cycle",
           "cpu_info", "cpu_peaks", "cpu_units", "detect", "last_level_cache_bytes", "vector_units"]
