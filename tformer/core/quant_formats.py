"""The weight formats a Linear can hold (config.quantize, quantize_head, quantize_layers), with the facts the
model, the ledger and the GGUF reader share: bits, group sizes, and ggml's block sizes.

int8: one scale per output row; int4: a scale and zero per quant_group inputs (tformer.model.quantized).
GGUF's block formats, what llama.cpp's files hold (tformer.model.block_quantized, kquant_linear):
q8_0 and q4_1 (32 weights, fp16 scales), q5_0 (32 weights, 5 bits), and the K-quants q4_k (256 weights in 8
sub-blocks of 32 with 6-bit scales and mins) and q6_k (256 weights in 16 sub-blocks of 16 with int8 scales).
"mixed" gives each layer's Linears their own format (quantize_layers), as a llama.cpp "Q4_K_M" file does.
"""

from __future__ import annotations

from tformer.core.errors import TformerError

QUANTIZATIONS = ("none", "int8", "int4", "q8_0", "q4_1", "q5_0", "q4_k", "q6_k", "mixed")
QUANT_BITS = {"int8": 8, "int4": 4, "q8_0": 8, "q4_1": 4, "q5_0": 5, "q4_k": 4, "q6_k": 6}
QUANT_GROUPS = (32, 64, 128, 256)  # int4's group sizes

# ggml's block formats: name -> (weights per block, bytes per block), from ggml-common.h. The file reader
# decodes all of them; a model keeps those of BLOCK_GROUPS in memory.
GGML_BLOCKS = {"Q4_0": (32, 18), "Q4_1": (32, 20), "Q5_0": (32, 22), "Q5_1": (32, 24), "Q8_0": (32, 34),
               "Q4_K": (256, 144), "Q5_K": (256, 176), "Q6_K": (256, 210)}
KEPT_BLOCKS = ("q8_0", "q4_1", "q5_0", "q4_k", "q6_k")
BLOCK_GROUPS = {name: GGML_BLOCKS[name.upper()][0] for name in KEPT_BLOCKS}  # a row holds whole blocks
RAW_BLOCKS = ("q5_0", "q4_k", "q6_k")  # kept as the file's block bytes (the others as their decoded parts)
# The kept formats the block kernel repacks once (tformer.model.ggml_kernel.PACKED): Linears that read one input
# and hold one of these run as one product (tformer.model.stacked_products); the K-quants run alone.
REPACKED_BLOCKS = ("q8_0", "q4_1", "q5_0")

# quantize_layers: per layer, "role:format" for each of its Linears, comma-separated (a role left out stays
# float), e.g. "q:q5_0,k:q5_0,v:q8_0,o:q4_k,gate:q5_0,up:q5_0,down:q6_k".
LAYER_ROLES = ("q", "k", "v", "o", "gate", "up", "down")
LAYER_FORMATS = ("none", "int8") + KEPT_BLOCKS  # int4 needs a group, which one config field sets for the model


def layer_formats(entry: str, layer: int) -> dict[str, str]:
    """One quantize_layers entry -> {role: format}, every role present ("none" where the entry leaves it)."""
    if not isinstance(entry, str):
        raise TformerError(f"quantize_layers[{layer}] is {entry!r}; give a string such as "
                           "'q:q5_0,k:q5_0,v:q8_0,o:q4_k,gate:q5_0,up:q5_0,down:q6_k'")
    formats = dict.fromkeys(LAYER_ROLES, "none")
    seen = set()
    for item in filter(None, (part.strip() for part in entry.split(","))):
        role, sep, fmt = (s.strip() for s in item.partition(":"))
        if not sep or role not in LAYER_ROLES or fmt not in LAYER_FORMATS:
            raise TformerError(f"quantize_layers[{layer}]: {item!r} is not role:format; roles are "
                               f"{', '.join(LAYER_ROLES)}, formats {', '.join(LAYER_FORMATS)}")
        if role in seen:
            raise TformerError(f"quantize_layers[{layer}] gives {role} twice; give each Linear one format")
        seen.add(role)
        formats[role] = fmt
    return formats


def layer_entry(formats: dict[str, str]) -> str:
    """{role: format} -> the quantize_layers entry (float roles left out)."""
    return ",".join(f"{role}:{formats[role]}" for role in LAYER_ROLES if formats.get(role, "none") != "none")


__all__ = ["BLOCK_GROUPS", "GGML_BLOCKS", "KEPT_BLOCKS", "LAYER_FORMATS", "LAYER_ROLES", "QUANTIZATIONS",
           "QUANT_BITS", "QUANT_GROUPS", "RAW_BLOCKS", "REPACKED_BLOCKS", "layer_entry", "layer_formats"]
