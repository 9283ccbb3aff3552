"""ggml's block formats in torch (tformer.interop.gguf_quants) against gguf-py's numpy reference, bit for bit.

Results are compared as int32 bit patterns, stricter than torch.equal: -0.0 differs from 0.0 and a NaN must
carry the same payload. Random blocks get finite fp16 scales (random scale bytes would make NaN scales,
whose payloads two NaN operands leave to each library's kernel); the float types take any bytes.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp

from tformer.core.errors import TformerError
from tformer.interop.gguf_quants import BLOCK_LAYOUTS, QUANTIZABLE, dequantize, quantize, quantized_nbytes

gguf = pytest.importorskip("gguf")
T = gguf.GGMLQuantizationType

QUANT_TYPES = [name for name, (per_block, _) in BLOCK_LAYOUTS.items() if per_block > 1]
FLOAT_TYPES = ["F32", "F16", "BF16"]
# Byte offsets of each block's fp16 scales.
SCALE_BYTES = {"Q4_0": (0,), "Q5_0": (0,), "Q8_0": (0,), "Q4_1": (0, 2), "Q5_1": (0, 2), "Q4_K": (0, 2),
               "Q5_K": (0, 2), "Q6_K": (208,)}


def finite_fp16(rng: np.random.Generator, n: int) -> np.ndarray:
    """n finite fp16 values as (n, 2) bytes: normal, subnormal, zero and negative zero, large."""
    bits = rng.integers(0, 1 << 16, n, dtype=np.uint16)
    bits[(bits & 0x7C00) == 0x7C00] &= 0xBFFF  # exponent all ones (inf / NaN) -> a large finite value
    return bits.view(np.uint8).reshape(n, 2)


def valid_blocks(rng: np.random.Generator, ggml_type: str, n_blocks: int) -> np.ndarray:
    _, block_bytes = BLOCK_LAYOUTS[ggml_type]
    blocks = rng.integers(0, 256, (n_blocks, block_bytes), dtype=np.uint8)
    for start in SCALE_BYTES[ggml_type]:
        blocks[:, start:start + 2] = finite_fp16(rng, n_blocks)
    return blocks


def reference(raw: np.ndarray, ggml_type: str, shape: tuple[int, ...]) -> torch.Tensor:
    per_block, block_bytes = BLOCK_LAYOUTS[ggml_type]
    rows = raw.reshape(-1, shape[-1] // per_block * block_bytes)
    with np.errstate(all="ignore"):
        out = gguf.quants.dequantize(rows, T[ggml_type])
    return torch.from_numpy(np.ascontiguousarray(out, dtype=np.float32)).reshape(shape)


def assert_bits_equal(ours: torch.Tensor, ref: torch.Tensor) -> None:
    assert ours.dtype == torch.float32 and ours.shape == ref.shape
    differ = ours.view(torch.int32) != ref.view(torch.int32)
    assert not differ.any(), f"{int(differ.sum())} values differ, first at {differ.nonzero()[0].tolist()}"


@pytest.mark.parametrize("ggml_type", QUANT_TYPES)
def test_dequantize_is_bit_identical_to_gguf(ggml_type):
    rng = np.random.default_rng(sum(map(ord, ggml_type)))
    per_block, _ = BLOCK_LAYOUTS[ggml_type]
    for shape in [(per_block,), (3, 2 * per_block), (2, 3, 4 * per_block)]:
        n_blocks = int(np.prod(shape)) // per_block
        raw = valid_blocks(rng, ggml_type, n_blocks).reshape(-1)
        assert_bits_equal(dequantize(raw, ggml_type, shape), reference(raw, ggml_type, shape))


@pytest.mark.parametrize("ggml_type", QUANT_TYPES)
def test_dequantize_many_blocks_and_every_scale(ggml_type):
    # 4096 blocks: every fp16 scale pattern class many times over, every nibble / bit position
    rng = np.random.default_rng(7)
    per_block, _ = BLOCK_LAYOUTS[ggml_type]
    raw = valid_blocks(rng, ggml_type, 4096)
    shape = (64, 64 * per_block)
    assert_bits_equal(dequantize(raw, ggml_type, shape), reference(raw, ggml_type, shape))


@pytest.mark.parametrize("ggml_type", FLOAT_TYPES)
def test_float_types_from_any_bytes(ggml_type):
    # every bit pattern class, NaN payloads and signalling NaNs included
    _, width = BLOCK_LAYOUTS[ggml_type]
    rng = np.random.default_rng(3)
    raw = rng.integers(0, 256, 8192 * width, dtype=np.uint8)
    if width == 2:  # all 65,536 halves once, then random ones
        raw = np.concatenate([np.arange(1 << 16, dtype=np.uint16).view(np.uint8), raw])
    shape = (raw.size // width // 64, 64)
    assert_bits_equal(dequantize(raw, ggml_type, shape), reference(raw, ggml_type, shape))


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(ggml_type=st.sampled_from(QUANT_TYPES), n_blocks=st.integers(1, 9), seed=st.integers(0, 2**32 - 1))
def test_dequantize_random_blocks(ggml_type, n_blocks, seed):
    raw = valid_blocks(np.random.default_rng(seed), ggml_type, n_blocks).reshape(-1)
    shape = (n_blocks * BLOCK_LAYOUTS[ggml_type][0],)
    assert_bits_equal(dequantize(raw, ggml_type, shape), reference(raw, ggml_type, shape))


def test_dequantize_takes_a_tensor_and_leaves_the_input_alone():
    rng = np.random.default_rng(1)
    raw = valid_blocks(rng, "Q4_1", 8).reshape(-1)
    before = raw.copy()
    from_numpy = dequantize(raw, "Q4_1", (2, 128))
    from_tensor = dequantize(torch.from_numpy(raw.copy()), "Q4_1", (2, 128))
    assert_bits_equal(from_tensor, from_numpy)
    assert np.array_equal(raw, before)
    f32 = rng.standard_normal(64).astype(np.float32)
    source = torch.from_numpy(f32.view(np.uint8).copy())
    out = dequantize(source, "F32", (64,))
    out += 1  # a copy: the caller's bytes do not change
    assert np.array_equal(source.numpy().view(np.float32), f32)
    read_only = f32.view(np.uint8)
    read_only.flags.writeable = False
    assert torch.equal(dequantize(read_only, "F32", (8, 8)), torch.from_numpy(f32).reshape(8, 8))


def test_block_table_matches_ggml():
    for name, layout in BLOCK_LAYOUTS.items():
        assert gguf.GGML_QUANT_SIZES[T[name]] == layout, name
    assert quantized_nbytes("Q4_1", (576, 1536)) == 576 * 1536 // 32 * 20
    assert quantized_nbytes("Q6_K", (2, 512)) == 4 * 210


@pytest.mark.parametrize("call, message", [
    (lambda: dequantize(np.zeros(20, np.uint8), "Q4_1", (16,)), "rows of 16"),
    (lambda: dequantize(np.zeros(19, np.uint8), "Q4_1", (32,)), "takes 20 bytes, got 19"),
    (lambda: dequantize(np.zeros(20, np.int8), "Q4_1", (32,)), "uint8"),
    (lambda: dequantize(np.zeros(20, np.uint8), "Q2_K", (32,)), "not one tformer decodes"),
    (lambda: quantize(torch.zeros(32), "Q4_K"), "tformer writes ggml types"),
    (lambda: quantize(torch.zeros(2, 48), "Q8_0"), "rows of 48"),
])
def test_bad_arguments_are_one_line(call, message):
    with pytest.raises(TformerError, match=message) as info:
        call()
    assert "\n" not in str(info.value)


def gguf_quantize(x: torch.Tensor, ggml_type: str) -> np.ndarray:
    with np.errstate(all="ignore"):
        return np.ascontiguousarray(gguf.quants.quantize(x.numpy(), T[ggml_type])).view(np.uint8).reshape(-1)


def edge_blocks() -> torch.Tensor:
    """Blocks that sit on the roundings: all zero, constant, exact halves, one outlier, tiny and huge values."""
    halves = torch.arange(-16, 16, dtype=torch.float32) + 0.5
    return torch.stack([
        torch.zeros(32), torch.full((32,), 3.25), torch.full((32,), -7.0),
        torch.cat([torch.tensor([127.0]), halves[1:]]),  # Q8_0: d = 1, every other value a half
        torch.linspace(0, 15, 32),  # Q4_1: d = 1, values on and between the steps
        torch.linspace(-1, 1, 32) * 1e-3, torch.linspace(-1, 1, 32) * 6e4, torch.linspace(-1, 1, 32) * 1e-6,
        torch.cat([torch.tensor([1e4]), torch.zeros(31)]), -torch.arange(32, dtype=torch.float32),
    ])


@pytest.mark.parametrize("ggml_type", QUANTIZABLE)
def test_quantize_equals_gguf_byte_for_byte(ggml_type):
    generator = torch.Generator().manual_seed(5)
    normal = torch.randn(48, 256, generator=generator) * torch.logspace(-4, 3, 48).unsqueeze(1)
    for x in [normal, edge_blocks(), edge_blocks().reshape(2, 5, 32)]:
        ours = quantize(x, ggml_type)
        assert ours.dtype == np.uint8 and ours.size == quantized_nbytes(ggml_type, tuple(x.shape))
        assert np.array_equal(ours, gguf_quantize(x, ggml_type))


@pytest.mark.parametrize("ggml_type", QUANTIZABLE)
def test_quantize_round_trip(ggml_type):
    x = torch.randn(16, 128, generator=torch.Generator().manual_seed(9))
    back = dequantize(quantize(x, ggml_type), ggml_type, x.shape)
    assert_bits_equal(back, reference(gguf_quantize(x, ggml_type), ggml_type, tuple(x.shape)))
    if ggml_type == "F32":
        assert torch.equal(back, x)
        return
    # half a step per value, plus what storing d and m as fp16 (11-bit mantissa) moves them
    blocks, err = x.reshape(-1, 32), (back - x).abs().reshape(-1, 32).amax(1)
    amax = blocks.abs().amax(1)
    step = {"F16": 0.0, "Q8_0": amax / 127, "Q4_1": (blocks.amax(1) - blocks.amin(1)) / 15}[ggml_type]
    assert bool((err <= step * 0.5 * 1.01 + 2e-3 * amax).all())


@pytest.mark.parametrize("ggml_type", ["F32", "F16"])
def test_float_types_write_any_bits_as_gguf_does(ggml_type):
    # inf, NaN with every kind of payload (F16 keeps its top 10 bits, as numpy does), subnormals, overflow
    bits = np.random.default_rng(11).integers(0, 2**32, 1 << 14, dtype=np.uint64).astype(np.uint32)
    bits[:2048] = (bits[:2048] & 0x807FFFFF) | 0x7F800000
    bits[2048:2056] = [0x7F800001, 0xFF800001, 0x7F802000, 0x7F801FFF, 0x7FC00000, 0xFFFFFFFF, 0x7F800000, 0x477FF000]
    x = torch.from_numpy(bits.view(np.float32).reshape(-1, 32).copy())
    assert np.array_equal(quantize(x, ggml_type), gguf_quantize(x, ggml_type))


@pytest.mark.parametrize("ggml_type", ["Q8_0", "Q4_1"])
def test_block_types_refuse_inf_and_nan(ggml_type):
    x = torch.zeros(2, 32)
    x[1, 3] = float("nan")
    x[0, 0] = float("inf")
    with pytest.raises(TformerError, match=f"2 inf or NaN values as {ggml_type}") as info:
        quantize(x, ggml_type)
    assert "\n" not in str(info.value)


def test_bytes_sliced_from_a_larger_tensor():
    storage = torch.from_numpy(valid_blocks(np.random.default_rng(2), "Q4_1", 5).reshape(-1))
    ragged = torch.cat([torch.zeros(3, dtype=torch.uint8), storage])[3:]  # storage offset 3
    assert_bits_equal(dequantize(ragged, "Q4_1", (160,)), dequantize(storage.numpy(), "Q4_1", (160,)))
    floats = torch.arange(40, dtype=torch.uint8)[1:33]
    assert torch.equal(dequantize(floats, "F32", (8,)), torch.from_numpy(floats.numpy().copy().view(np.float32)))


# Finite floats whose block arithmetic stays finite: below 1e-30 -> 0 (1/d of a subnormal d is inf in
# both libraries, and what each then makes of inf * 0 is its own business), magnitudes up to 2**100.
_FLOATS = st.floats(-2.0**100, 2.0**100, width=32).map(lambda v: 0.0 if abs(v) < 1e-30 else v)


@settings(max_examples=80, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(ggml_type=st.sampled_from(QUANTIZABLE), blocks=hnp.arrays(np.float32, st.tuples(st.integers(1, 4), st.just(32)),
                                                                elements=_FLOATS))
def test_quantize_any_finite_blocks(ggml_type, blocks):
    x = torch.from_numpy(blocks)
    assert np.array_equal(quantize(x, ggml_type), gguf_quantize(x, ggml_type))
