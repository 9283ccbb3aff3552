"""The block-quantized kernel (tformer.model.ggml_kernel, C in tformer/model/csrc) against its stated arithmetic:
x rounded per block of 32 to 8 bits as ggml's Q8_0 quantizer rounds it (tformer.model.block_quantized, itself
checked against gguf-py), W the file's values as ggml decodes them (tformer.model.ggml_blocks, checked against
gguf-py's dequantizers), the product evaluated in float64. Also against F.linear on the dequantized weights
with the bound the 8-bit rounding of x allows, and the property serving needs: a row's result does not depend on
the batch it is in nor on the thread count."""

import os
import subprocess
import sys

import pytest
import torch
import torch.nn.functional as F

from tformer.core.errors import TformerError
from tformer.core.quant_formats import GGML_BLOCKS
from tformer.model import ggml_kernel
from tformer.model.block_quantized import q8_0_blocks
from tformer.model.ggml_blocks import decode
from tformer.model.ggml_encode import random_blocks

FORMATS = list(ggml_kernel.FORMATS)

if not ggml_kernel.available() and not ggml_kernel.compiler_found():
    pytest.skip(f"no C compiler on this machine: {ggml_kernel.unavailable_reason()}", allow_module_level=True)


def test_the_kernel_is_built_where_a_compiler_is():
    # The README's install command builds it on any machine with a compiler; a missing build is a failure here.
    assert ggml_kernel.available(), ggml_kernel.unavailable_reason()
    assert ggml_kernel.simd() in ("AVX-512 VNNI", "AVX2", "portable C")


def _weights(ggml_type: str, n: int, k: int, seed: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    """Random blocks (every bit pattern, finite scales) and the (n, k) fp32 values they hold."""
    blocks = random_blocks(n, k, ggml_type, torch.Generator().manual_seed(seed))
    _, block_bytes = GGML_BLOCKS[ggml_type]
    return blocks, decode(blocks.reshape(-1, block_bytes), ggml_type).view(n, k)


def _definition(x: torch.Tensor, w: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """The stated arithmetic in float64: x through the Q8_0 round trip, times W. Also sum |x'| |W| per output, the
    scale of the fp32 rounding the kernel may add."""
    q, d = q8_0_blocks(x.reshape(-1, 32))
    rounded = (q.double() * d.double()).view(x.shape)
    return rounded @ w.double().T, rounded.abs() @ w.double().abs().T


def _width(ggml_type: str, blocks_per_row: int) -> int:
    return GGML_BLOCKS[ggml_type][0] * blocks_per_row


@pytest.mark.parametrize("ggml_type", FORMATS)
@pytest.mark.parametrize("rows", [1, 2, 3, 4, 5, 8, 17, 32, 128])
def test_the_product_is_the_stated_arithmetic(ggml_type, rows):
    n, k = 37, _width(ggml_type, 3)  # odd outputs, an odd count of blocks (the kernel pairs them)
    blocks, w = _weights(ggml_type, n, k, seed=rows)
    x = torch.randn(rows, k, generator=torch.Generator().manual_seed(100 + rows)) * 3
    y = ggml_kernel.matmul(x, blocks, ggml_type)
    exact, magnitude = _definition(x, w)
    assert y.shape == (rows, n) and y.dtype == torch.float32
    # fp32 accumulation over k terms: a few ulps of the magnitude, far below what a wrong scale, nibble or sign gives
    assert ((y.double() - exact).abs() <= 1e-5 * magnitude + 1e-30).all()


@pytest.mark.parametrize("ggml_type", FORMATS)
def test_against_float_linear_on_the_dequantized_weights(ggml_type):
    n, k = 64, _width(ggml_type, 4)
    blocks, w = _weights(ggml_type, n, k, seed=7)
    x = torch.randn(9, k, generator=torch.Generator().manual_seed(8))
    y = ggml_kernel.matmul(x, blocks, ggml_type).double()
    reference = F.linear(x.double(), w.double())
    # x's 8-bit rounding moves each value by at most half a step, amax / 254 of its block of 32.
    step = x.reshape(9, -1, 32).abs().amax(dim=-1, keepdim=True).expand(9, k // 32, 32).reshape(9, k) / 254
    bound = step.double() @ w.double().abs().T
    assert ((y - reference).abs() <= bound * 1.0001 + 1e-4).all()
    assert (y - reference).abs().max() > 0  # the activations are rounded: the kernel is not F.linear in disguise


@pytest.mark.parametrize("ggml_type", FORMATS)
def test_a_row_does_not_depend_on_its_batch_or_the_threads(ggml_type):
    n, k = 301, _width(ggml_type, 3)
    blocks, _ = _weights(ggml_type, n, k, seed=3)
    x = torch.randn(128, k, generator=torch.Generator().manual_seed(4))
    alone = torch.cat([ggml_kernel.matmul(x[i:i + 1], blocks, ggml_type, threads=1) for i in range(128)])
    for threads in (1, 2, 3):
        # whole tiles of 4, and 1, 2 or 3 rows left over as one tile (every row compared, the left-over ones too)
        for rows in (128, 33, 7, 6, 3, 2):
            batch = ggml_kernel.matmul(x[:rows], blocks, ggml_type, threads=threads)
            assert torch.equal(batch, alone[:rows]), (threads, rows)


def test_zero_rows_and_zero_activations():
    blocks, _ = _weights("Q4_1", 5, 64)
    assert ggml_kernel.matmul(torch.zeros(0, 64), blocks, "Q4_1").shape == (0, 5)
    # an all-zero block of x has d = 0: its contribution is exactly zero, no NaN from 0 / 0
    y = ggml_kernel.matmul(torch.zeros(2, 64), blocks, "Q4_1")
    assert torch.equal(y, torch.zeros(2, 5))


@pytest.mark.parametrize("bad, match", [
    (dict(x=torch.randn(2, 64, dtype=torch.float64)), "fp32"),
    (dict(x=torch.randn(2, 3, 64)), "fp32"),
    (dict(x=torch.randn(2, 96)), "blocks for an input width 96"),
    (dict(blocks=torch.zeros(5, 41, dtype=torch.uint8)), "blocks for an input width 64"),
    (dict(ggml_type="Q5_1"), "runs Q4_0"),
    (dict(threads=0), "1 to 256 threads"),
])
def test_bad_operands_are_refused_in_one_line(bad, match):
    blocks, _ = _weights("Q4_1", 5, 64)
    args = dict(x=torch.randn(2, 64), blocks=blocks, ggml_type="Q4_1", threads=None) | bad
    with pytest.raises(TformerError, match=match):
        ggml_kernel.matmul(**args)


_PATH_CHECK = """
import torch
from tformer.model import ggml_kernel
from tformer.core.quant_formats import GGML_BLOCKS
from tformer.model.block_quantized import q8_0_blocks
from tformer.model.ggml_blocks import decode
from tformer.model.ggml_encode import random_blocks
print(ggml_kernel.simd())
for t in ggml_kernel.FORMATS:
    per, nb = GGML_BLOCKS[t]
    k = 3 * per
    blocks = random_blocks(19, k, t, torch.Generator().manual_seed(1))
    w = decode(blocks.reshape(-1, nb), t).view(19, k).double()
    x = torch.randn(6, k, generator=torch.Generator().manual_seed(2))
    q, d = q8_0_blocks(x.reshape(-1, 32))
    xr = (q.double() * d.double()).view(x.shape)
    y = ggml_kernel.matmul(x, blocks, t, threads=2).double()
    assert ((y - xr @ w.T).abs() <= 1e-5 * (xr.abs() @ w.abs().T)).all(), t
print("ok")
"""


@pytest.mark.parametrize("forced, expect", [("portable", "portable C"), ("avx2", None)])
def test_each_instruction_set_computes_the_same_arithmetic(forced, expect):
    # The path a CPU without AVX2 (or without VNNI) runs, forced here so this machine checks it too.
    out = subprocess.run([sys.executable, "-c", _PATH_CHECK], env={**os.environ, "TFORMER_KERNEL_SIMD": forced},
                         capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-2000:]
    simd, status = out.stdout.split()[-2:] if expect is None else (out.stdout.splitlines()[0], out.stdout.split()[-1])
    assert status == "ok"
    if expect:
        assert simd == expect
    else:
        assert out.stdout.splitlines()[0] in ("AVX2", "portable C")  # never VNNI when AVX2 is asked for


def test_the_custom_op_is_well_formed_for_the_compiler():
    blocks, _ = _weights("Q8_0", 16, 64)
    x = torch.randn(3, 64)
    packed = ggml_kernel.repack(blocks, "Q8_0")
    torch.library.opcheck(ggml_kernel.ggml_matmul, (x, packed, ggml_kernel.FORMATS["Q8_0"]))
    eager = ggml_kernel.matmul(x, blocks, "Q8_0")
    assert torch.equal(ggml_kernel.ggml_matmul(x, packed, ggml_kernel.FORMATS["Q8_0"]), eager)
    assert torch.equal(ggml_kernel.product(x, packed, ggml_kernel.FORMATS["Q8_0"]), eager)


@pytest.mark.parametrize("ggml_type", FORMATS)
def test_repacking_keeps_every_byte(ggml_type):
    blocks, _ = _weights(ggml_type, 7, _width(ggml_type, 9))
    packed = ggml_kernel.repack(blocks, ggml_type)
    assert packed.shape == blocks.shape
    assert torch.equal(torch.sort(packed.flatten()).values, torch.sort(blocks.flatten()).values)
    assert torch.equal(packed, blocks) == (ggml_type not in ggml_kernel.PACKED)


@pytest.mark.slow
def test_a_compiled_graph_calls_the_kernel_as_one_op():
    blocks, _ = _weights("Q4_1", 48, 64)

    def step(x):
        return torch.relu(ggml_kernel.matmul(x * 2, blocks, "Q4_1")) + 1

    compiled = torch.compile(step, dynamic=True)
    for rows in (1, 5, 9):
        x = torch.randn(rows, 64)
        assert torch.equal(compiled(x), step(x))


_WITHOUT_KERNEL = """
import sys
sys.modules["tformer.model._ggml_kernel"] = None  # as on a machine that installed tformer without a compiler
from tformer.cli import main
sys.exit(main(sys.argv[1:]))
"""


@pytest.mark.parametrize("weights, code", [("auto", 0), ("kernel", 2)])
def test_without_the_kernel_auto_says_so_and_runs_fp32_and_kernel_refuses(smollm2_path, weights, code):
    args = ["generate", "--gguf", str(smollm2_path), "--gguf-weights", weights, "--prompt", "Hi", "--greedy",
            "--max-new-tokens", "2"]
    out = subprocess.run([sys.executable, "-c", _WITHOUT_KERNEL, *args], capture_output=True, text=True, timeout=300)
    assert out.returncode == code, out.stderr[-2000:]
    lines = [line for line in out.stderr.splitlines() if "kernel is not built" in line]
    assert len(lines) == 1 and "Traceback" not in out.stderr, out.stderr[-2000:]
    assert "running torch's path" in lines[0]
    if code == 0:  # auto went on in fp32: generate's figures line names the dtype it ran
        assert "fp32)" in out.stdout + out.stderr
