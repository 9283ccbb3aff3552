"""What a weight-only quantized Linear (tformer.cost.architecture.Linear with ``bits``) stores and reads.

int8: ``weight`` (d_out, d_in) int8 and one fp32 ``scale`` per output row (symmetric: W = q * scale).
int4: ``weight`` (d_out, d_in / 2) uint8, inputs 2j and 2j+1 of a row in byte j's low and high nibble, and a
bf16 ``scale`` and ``zero`` per ``group`` inputs of each row (asymmetric: W = (q - 8) * scale + zero, q in
0..15; the form torch's int4 CPU kernel takes, in the dtype it is fed).
q8_0: ``weight`` (d_out, d_in) int8 and an fp16 ``scale`` per 32 inputs (GGUF's Q8_0: 34 bytes per 32 weights).
q4_1: ``weight`` packed as int4's, an fp16 ``scale`` and ``min`` per 32 inputs (GGUF's Q4_1: 20 bytes per 32).
q5_0, q4_k, q6_k: ``blocks`` (d_out, bytes of a row's blocks) uint8, the file's blocks as they are (22 bytes per 32
weights, 144 and 210 per 256; tformer.model.kquant_linear decodes them).
The bias stays float. The model's buffers (tformer.model.quantized, block_quantized) are these, so the ledger's
weight bytes are the state dict's.
"""

from __future__ import annotations

from dataclasses import replace

from tformer.core.quant_formats import GGML_BLOCKS, RAW_BLOCKS
from tformer.cost.description import Linear


def quantized_buffers(spec: Linear) -> dict[str, tuple[tuple[int, ...], str, int]]:
    """A quantized Linear's buffers: name -> (shape, dtype, bytes per element); {} for a float Linear."""
    p, n, k = spec.path, spec.d_out, spec.d_in
    groups = (n, k // spec.group) if spec.group else ()
    if spec.layout == "int8":
        return {f"{p}.weight": ((n, k), "int8", 1), f"{p}.scale": ((n,), "float32", 4)}
    if spec.layout == "int4":
        return {f"{p}.weight": ((n, k // 2), "uint8", 1), f"{p}.scale": (groups, "bfloat16", 2),
                f"{p}.zero": (groups, "bfloat16", 2)}
    if spec.layout == "q8_0":
        return {f"{p}.weight": ((n, k), "int8", 1), f"{p}.scale": (groups, "float16", 2)}
    if spec.layout == "q4_1":
        return {f"{p}.weight": ((n, k // 2), "uint8", 1), f"{p}.scale": (groups, "float16", 2),
                f"{p}.min": (groups, "float16", 2)}
    if spec.layout in RAW_BLOCKS:
        per_block, block_bytes = GGML_BLOCKS[spec.layout.upper()]
        return {f"{p}.blocks": ((n, k // per_block * block_bytes), "uint8", 1)}
    return {}


def linear_weight_bytes(spec: Linear, float_bytes: int) -> int:
    """Bytes of W and b that one product with ``spec`` reads: float W at ``float_bytes`` each, or the quantized
    buffers (the bias at ``float_bytes``)."""
    bias = spec.d_out * float_bytes if spec.bias else 0
    if not spec.layout:
        return spec.d_out * spec.d_in * float_bytes + bias
    return sum(_numel(shape) * size for shape, _, size in quantized_buffers(spec).values()) + bias


def linears(part) -> list[Linear]:
    """Every Linear inside ``part`` (an Architecture or any piece of it), once per path, in field order."""
    found: dict[str, Linear] = {}

    def walk(x) -> None:
        if isinstance(x, Linear):
            found.setdefault(x.path, x)
        elif isinstance(x, tuple):
            for item in x:
                walk(item)
        elif hasattr(x, "__dataclass_fields__"):
            for name in x.__dataclass_fields__:
                walk(getattr(x, name))
    walk(part)
    return list(found.values())


def architecture_buffers(arch) -> dict[str, tuple[tuple[int, ...], str, int]]:
    """Every quantized buffer of a described model (name -> shape, dtype, bytes per element)."""
    out: dict = {}
    for spec in linears(arch):
        out.update(quantized_buffers(spec))
    return out


def quantized_saving(arch, float_bytes: int) -> int:
    """Bytes the quantized Linears of ``arch`` save against float weights of ``float_bytes`` each."""
    return sum(linear_weight_bytes(replace(s, bits=0, group=0, layout=""), float_bytes)
               - linear_weight_bytes(s, float_bytes) for s in linears(arch) if s.layout)


def _numel(shape: tuple[int, ...]) -> int:
    n = 1
    for x in shape:
        n *= x
    return n
