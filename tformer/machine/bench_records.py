"""What a `tformer bench` run produces: the measured points, the comparisons with theory, and the
result that is saved per machine (tformer.machine.profile_store) and becomes a roofline Device.

The measurements themselves are in tformer.measure.bench; these records only hold, load and convert.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field

from tformer.core.errors import TformerError
from tformer.machine.device import Device
from tformer.machine.peaks import above_peak_note

MATMUL_DTYPES = ("fp32", "tf32", "fp64", "bf16", "fp16", "int8")
STREAM_KERNELS = ("copy", "scale", "add", "triad")
STREAM_ARRAYS = {"copy": 2, "scale": 2, "add": 3, "triad": 3}


@dataclass(kw_only=True)
class Timing:
    """Seconds per call over the repetitions of one measured point, and how they were taken."""

    median_s: float
    min_s: float
    max_s: float
    q1_s: float
    q3_s: float
    reps: int
    calls_per_rep: int


@dataclass
class MatmulPoint(Timing):
    device: str
    dtype: str
    n: int
    flops: int  # per call: 2 n^3 (OPS for int8)
    flops_per_s: float  # from the median time
    flops_per_s_best: float  # from the fastest repetition


@dataclass
class StreamPoint(Timing):
    device: str
    kernel: str
    elements: int
    element_bytes: int
    bytes: int  # per call, STREAM convention
    bytes_per_s: float
    bytes_per_s_best: float


@dataclass
class GemvPoint(Timing):
    device: str
    dtype: str
    rows: int  # rows of x (tokens): 1 is a true matrix-vector product
    n: int  # output features (rows of W)
    k: int  # input features
    weight_bytes: int  # bytes of W, the only bytes counted
    bytes_per_s: float  # weight bytes / median time
    bytes_per_s_best: float  # weight bytes / fastest repetition


@dataclass
class ElementwisePoint(Timing):
    device: str
    kernel: str  # "add", "gelu", "layer_norm", "softmax": what the model's element-wise ops run
    elements: int  # of the output
    width: int  # the last dimension (a norm or softmax reduces over it)
    bytes: int  # per call: every input and output array once (the ledger's convention)
    bytes_per_s: float  # bytes / median time
    bytes_per_s_best: float


@dataclass
class Comparison:
    quantity: str  # "fp32 matmul", "triad bandwidth", ...
    unit: str
    measured: float | None
    theoretical: float | None
    ratio: float | None
    theoretical_source: str
    reasons: list[str] = field(default_factory=list)
    # cores x lanes x 2 x FMA units of the formula (CPU matmuls; None elsewhere and in older profiles):
    # measured / this is the clock the measurement implies.
    flops_per_cycle: float | None = None

    def above_peak(self) -> str | None:
        """The clause printed beside the ratio when the measurement beats the theoretical figure, else None."""
        return above_peak_note(self.measured, self.theoretical, self.flops_per_cycle)


@dataclass
class DeviceBench:
    device: str  # "cpu", "cuda:0"
    name: str
    threads: int | None = None
    memory_bytes: int | None = None
    matmul: list[MatmulPoint] = field(default_factory=list)
    stream: list[StreamPoint] = field(default_factory=list)
    gemv: list[GemvPoint] = field(default_factory=list)  # absent from profiles saved before it existed
    elementwise: list[ElementwisePoint] = field(default_factory=list)  # likewise
    skipped: list[str] = field(default_factory=list)
    comparisons: list[Comparison] = field(default_factory=list)

    def best_matmul(self, dtype: str) -> MatmulPoint | None:
        points = [p for p in self.matmul if p.dtype == dtype]
        return max(points, key=lambda p: p.flops_per_s) if points else None

    def best_stream(self, kernel: str) -> StreamPoint | None:
        points = [p for p in self.stream if p.kernel == kernel]
        return max(points, key=lambda p: p.bytes_per_s) if points else None


@dataclass
class BenchResult:
    machine_key: str
    created: str
    quick: bool
    torch_version: str
    wall_s: float
    devices: list[DeviceBench]
    conventions: list[str] = field(default_factory=list)
    load_before: float | None = None  # 1-minute load average when the run started (other processes)
    logical_cpus: int | None = None

    def to_dict(self) -> dict:
        return asdict(self)

    @classmethod
    def from_dict(cls, data: dict) -> "BenchResult":
        devices = []
        for d in data["devices"]:
            devices.append(DeviceBench(
                device=d["device"], name=d["name"], threads=d.get("threads"), memory_bytes=d.get("memory_bytes"),
                matmul=[MatmulPoint(**p) for p in d.get("matmul", [])],
                stream=[StreamPoint(**p) for p in d.get("stream", [])],
                gemv=[GemvPoint(**p) for p in d.get("gemv", [])],
                elementwise=[ElementwisePoint(**p) for p in d.get("elementwise", [])],
                skipped=list(d.get("skipped", [])),
                comparisons=[Comparison(**c) for c in d.get("comparisons", [])]))
        return cls(machine_key=data["machine_key"], created=data["created"], quick=bool(data["quick"]),
                   torch_version=data["torch_version"], wall_s=float(data["wall_s"]), devices=devices,
                   conventions=list(data.get("conventions", [])), load_before=data.get("load_before"),
                   logical_cpus=data.get("logical_cpus"))

    def device(self, which: str | None = None) -> DeviceBench:
        """The named device ("cpu", "cuda:0", "cuda"), or by default the first GPU, else the CPU."""
        if not self.devices:
            raise TformerError("the saved profile holds no devices; rerun `tformer bench --quick`")
        if which is None:
            gpus = [d for d in self.devices if d.device.startswith("cuda")]
            return gpus[0] if gpus else self.devices[0]
        for d in self.devices:
            if d.device == which or (which == "cuda" and d.device.startswith("cuda")):
                return d
        raise TformerError(f"the saved profile has no device {which!r}; it has "
                           f"{', '.join(d.device for d in self.devices)}")

    def to_device(self, which: str | None = None):
        """A Device (kind "measured") for the roofline: best median matmul FLOP/s per dtype, triad bandwidth."""
        d = self.device(which)
        peaks = {}
        for dtype in MATMUL_DTYPES:
            best = d.best_matmul(dtype)
            if best:
                peaks[dtype] = best.flops_per_s
        # The whole curve (median FLOP/s at each size) travels with the Device, so the roofline can
        # predict a small matmul at the rate this machine reaches at that size, not at its best.
        curve = {}
        for p in d.matmul:
            curve.setdefault(p.dtype, []).append([p.n, p.flops_per_s])
        stream_bw = {k: d.best_stream(k).bytes_per_s for k in STREAM_KERNELS if d.best_stream(k)}
        triad, copy = d.best_stream("triad"), d.best_stream("copy")
        bw_point, bw_kernel = (triad, "triad") if triad else (copy, "copy")
        # Weight-read bandwidth of few-row matmuls per dtype, as [rows, k, B/s] (median time).
        gemv_bw: dict[str, list] = {}
        for p in d.gemv:
            gemv_bw.setdefault(p.dtype, []).append([p.rows, p.k, p.bytes_per_s])
        gemv_bw = {k: sorted(v) for k, v in gemv_bw.items()}
        # Element-wise kernels' bytes/s by output size, per kernel: far below STREAM where the
        # arithmetic (erf, exp) or the reduction, not the bytes, sets the pace.
        elementwise_bw: dict[str, list] = {}
        for p in d.elementwise:
            elementwise_bw.setdefault(p.kernel, []).append([p.elements, p.bytes_per_s])
        mode = "quick" if self.quick else "full"
        return Device.from_roofs(
            f"measured {d.name} ({d.device})", "measured", peaks,
            bandwidth=bw_point.bytes_per_s if bw_point else None, memory_bytes=d.memory_bytes,
            matmul_curve={k: sorted(v) for k, v in curve.items()}, stream_bandwidth=stream_bw,
            gemv_bandwidth=gemv_bw, elementwise_bandwidth={k: sorted(v) for k, v in elementwise_bw.items()},
            source=(f"measured by `tformer bench` ({mode}) on {self.created}: peak = best median matmul "
                    f"FLOP/s over the size sweep per dtype; bandwidth = STREAM {bw_kernel} median "
                    f"({STREAM_ARRAYS[bw_kernel]} arrays counted)" if bw_point else
                    f"measured by `tformer bench` ({mode}) on {self.created}; bandwidth not measured"),
            notes=f"machine {self.machine_key}; {d.threads} threads" if d.threads else f"machine {self.machine_key}",
        )


__all__ = ["MATMUL_DTYPES", "STREAM_ARRAYS", "STREAM_KERNELS", "BenchResult", "Comparison", "DeviceBench",
           "ElementwisePoint", "GemvPoint", "MatmulPoint", "StreamPoint"]
