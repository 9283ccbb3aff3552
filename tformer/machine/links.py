"""Links between devices: bandwidth in one direction per device, from the standard or datasheet.

A ring all-reduce sends and receives at once, so its time is the bytes each device sends over the
one-way bandwidth. Bidirectional figures in datasheets ("900 GB/s NVLink") are halved here.
1 GB/s = 1e9 bytes/s.
"""

from __future__ import annotations

from tformer.core.errors import TformerError
from tformer.core.inputs import Bounds

# GB/s one way: from a modem's (1 kB/s) to a million times NVLink's, so every transfer time stays a finite float.
LINK_GBPS = Bounds(1e-6, 1e9, note="GB/s one way")

# name -> (bytes/s one way per device, source)
LINKS: dict[str, tuple[float, str]] = {
    "nvlink2": (150e9, "NVIDIA V100 datasheet: NVLink 300 GB/s (both directions)"),
    "nvlink3": (300e9, "NVIDIA A100 datasheet: NVLink 600 GB/s (both directions)"),
    "nvlink4": (450e9, "NVIDIA H100 datasheet: NVLink 900 GB/s (both directions)"),
    "pcie3": (15.75e9, "PCIe 3.0 x16: 8 GT/s x 16 lanes, 128b/130b"),
    "pcie4": (31.5e9, "PCIe 4.0 x16: 16 GT/s x 16 lanes, 128b/130b"),
    "pcie5": (63e9, "PCIe 5.0 x16: 32 GT/s x 16 lanes, 128b/130b"),
    "infinity-fabric": (448e9, "AMD MI300X datasheet: 7 Infinity Fabric links of 128 GB/s (both directions)"),
    "ib-hdr": (25e9, "InfiniBand HDR: 200 Gb/s per port"),
    "ib-ndr": (50e9, "InfiniBand NDR: 400 Gb/s per port"),
    "ethernet-100g": (12.5e9, "100 Gb/s Ethernet"),
}

# The link a spec-table device has to its neighbours in one node (the SXM/OAM parts' GPU-to-GPU
# fabric, the PCIe cards' host slot).
DEVICE_LINKS = {
    "a100-40gb-sxm": "nvlink3", "a100-80gb-sxm": "nvlink3", "a100-40gb-pcie": "pcie4", "a100-80gb-pcie": "pcie4",
    "h100-sxm": "nvlink4", "h200": "nvlink4", "h100-pcie": "pcie5",
    "v100-sxm2-32gb": "nvlink2", "v100-sxm2-16gb": "nvlink2",
    "t4": "pcie3", "l4": "pcie4", "rtx-3060-ti": "pcie4", "rtx-3090": "pcie4", "rtx-4090": "pcie4",
    "mi300x": "infinity-fabric",
}


def link_bandwidth(spec: str | float | None, device=None) -> tuple[float | None, str]:
    """(bytes/s one way, where it comes from) for ``spec`` (a link name or GB/s), else the device's link."""
    if spec is not None and str(spec).strip():
        text = str(spec).strip().lower()
        if text in LINKS:
            bw, source = LINKS[text]
            return bw, f"{text}: {source}"
        try:
            gbps = float(text)
        except ValueError:
            raise TformerError(f"--link-bandwidth {spec!r} is neither a number of GB/s nor a link; give e.g. 450 or one of: "
                               f"{', '.join(LINKS)}") from None
        return LINK_GBPS.check(gbps, "--link-bandwidth") * 1e9, "given (--link-bandwidth)"
    name = getattr(device, "name", None)
    if name in DEVICE_LINKS:
        bw, source = LINKS[DEVICE_LINKS[name]]
        return bw, f"{DEVICE_LINKS[name]} ({name}): {source}"
    return None, "unknown: give --link-bandwidth (GB/s one way, or a link name)"
