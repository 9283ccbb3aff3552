"""The machine layer: what a device can do, with the source of every number, and no torch.

- device: the Device record (roofs per dtype, bandwidth, measured curves);
- peaks: the course's peak formulas, the Peak record, the clock a measurement implies;
- spec_table: datasheet devices by name or alias, and driver GPU names mapped onto them;
- describe: devices described by the user (JSON, key=value pairs) and ``resolve_hardware``;
- specs, gpu_specs: this machine's CPU, memory and GPUs and their theoretical peaks (the GPUs PyTorch
  sees are probed one layer up, in tformer.measure.probe);
- bench_records, profile_store: the measured profile `tformer bench` saves, and its cache.
"""

from tformer.machine.bench_records import (
                                           MATMUL_DTYPES,
                                           STREAM_ARRAYS,
                                           STREAM_KERNELS,
                                           BenchResult,
                                           Comparison,
                                           DeviceBench,
                                           ElementwisePoint,
                                           GemvPoint,
                                           MatmulPoint,
                                           StreamPoint,
)
from tformer.machine.describe import device_from_dict, parse_pairs, resolve_hardware
from tformer.machine.device import DTYPE_BITS, DTYPES, Device, GiB
from tformer.machine.gpu_specs import GPUInfo, add_nvml, driver_gpu_names, gpu_peaks
from tformer.machine.peaks import (
                                           Peak,
                                           above_peak_note,
                                           cpu_peak_flops,
                                           gpu_bandwidth,
                                           implied_clock_hz,
                                           memory_bandwidth,
                                           simd_lanes,
                                           vs_theoretical,
)
from tformer.machine.profile_store import (
                                           cache_dir,
                                           load_measured_device,
                                           load_profile,
                                           machine_key,
                                           profile_path,
                                           save_profile,
)
from tformer.machine.spec_table import SPEC_TABLE, device_names, lookup, match_gpu_name
from tformer.machine.specs import (
                                           NO_NATIVE,
                                           Cache,
                                           CPUInfo,
                                           MachineSpecs,
                                           MemoryInfo,
                                           available_memory_bytes,
                                           cpu_flops_per_cycle,
                                           cpu_info,
                                           cpu_peaks,
                                           cpu_units,
                                           detect,
                                           last_level_cache_bytes,
                                           usable_cpus,
                                           vector_units,
)

__all__ = ["DTYPES", "DTYPE_BITS", "GiB", "MATMUL_DTYPES", "NO_NATIVE", "SPEC_TABLE", "STREAM_ARRAYS", "STREAM_KERNELS",
           "BenchResult", "CPUInfo", "Cache", "Comparison", "Device", "DeviceBench", "ElementwisePoint",
           "GPUInfo", "GemvPoint",
           "MachineSpecs", "MatmulPoint", "MemoryInfo", "Peak", "StreamPoint", "above_peak_note", "add_nvml",
           "available_memory_bytes",
           "cache_dir", "cpu_flops_per_cycle", "cpu_info", "cpu_peak_flops", "cpu_peaks", "cpu_units", "detect",
           "device_from_dict", "device_names", "driver_gpu_names", "gpu_bandwidth", "gpu_peaks", "implied_clock_hz",
           "last_level_cache_bytes", "load_measured_device", "load_profile", "lookup", "machine_key",
           "match_gpu_name", "memory_bandwidth", "parse_pairs", "profile_path", "resolve_hardware", "save_profile",
           "usable_cpus",
           "simd_lanes", "vector_units", "vs_theoretical"]
