"""The block-quantized matrix product, compiled from tformer/model/csrc/ggml_kernel.c when tformer was installed
with a C compiler: y (M, N) = x (M, K) W^T, W kept as a GGUF file's blocks (Q4_0, Q4_1, Q5_0, Q8_0, Q4_K, Q6_K).

Its arithmetic, which tests/model/test_ggml_kernel.py checks against a float64 evaluation of this definition:
    x is quantized per block of 32 to 8 bits, as ggml quantizes Q8_0 (d = amax / 127 in fp32, q = roundf(x / d));
    per block of 32 weights, the integer dot of the weight's small integers with q, times (weight scale * d), plus
    the weight's offset (Q4_0's -8 d, Q4_1's min, a K-quant sub-block's min, Q6_K's -32 s) times d * sum(q).
So W's values are exactly the file's (tformer.model.ggml_blocks decodes the same ones); x is rounded to 8 bits,
as llama.cpp's CPU backend rounds it. Each output row comes out the same whatever the batch it is computed in
and however many threads split the work; with attention row-exact beside it (tformer.model.attention.row_exact,
whose C routine is attend() here), a served request gets the tokens generate gives.

matmul() checks its operands and repacks the blocks on every call (tests, one-off products); a Linear repacks
once and calls product(), which calls the C function directly in eager mode (a decode step makes ~200 calls) and
the op tformer::ggml_matmul inside a torch.compile graph, which the compiler keeps as one opaque call.
"""

from __future__ import annotations

import shutil
import sysconfig

import torch

from tformer.core.errors import TformerError
from tformer.core.quant_formats import GGML_BLOCKS

try:
    from tformer.model import _ggml_kernel as _native
except ImportError:  # installed without a C compiler, or a build that failed (pip said why, then went on)
    _native = None

_THREADS = 0  # the kernel's own thread count (0: torch's; take_threads() sets it)
FORMATS = {"Q4_0": 0, "Q4_1": 1, "Q5_0": 2, "Q8_0": 3, "Q4_K": 4, "Q6_K": 5}  # the C side's format ids


def available() -> bool:
    return _native is not None


def compiler_found() -> bool:
    """Whether this machine has the C compiler the install would have used (tests fail, not skip, when it does
    and the kernel is missing)."""
    cc = (sysconfig.get_config_var("CC") or "cc").split()[0]
    return shutil.which(cc) is not None or shutil.which("cc") is not None


def unavailable_reason() -> str:
    """One line: why the kernel is missing and how to get it ("" when it is here)."""
    if _native is not None:
        return ""
    how = ("reinstall with `python3 -m pip install -e .` to build it" if compiler_found() else
           "no C compiler was found when tformer was installed; install one (gcc or clang) and reinstall with "
           "`python3 -m pip install -e .`")
    return (f"the block-quantized kernel is not built (no tformer/model/_ggml_kernel*.so); {how}; running torch's "
            "path instead")


def simd() -> str:
    """The instruction set the kernel runs on this CPU ("AVX-512 VNNI", "AVX2", "portable C")."""
    return _native.simd() if _native is not None else "not built"


def _check(x: torch.Tensor, blocks: torch.Tensor, ggml_type: str) -> None:
    if _native is None:
        raise TformerError(unavailable_reason())
    if ggml_type not in FORMATS:
        raise TformerError(f"the kernel runs {', '.join(FORMATS)} blocks, not {ggml_type!r}; use the reference path")
    per_block, block_bytes = GGML_BLOCKS[ggml_type]
    if x.dim() != 2 or x.dtype != torch.float32 or x.device.type != "cpu":
        raise TformerError(f"the kernel takes x as (rows, in) fp32 on the CPU, got {tuple(x.shape)} {x.dtype} on "
                           f"{x.device}")
    k = x.shape[1]
    if k % per_block or blocks.dtype != torch.uint8 or blocks.dim() != 2 or blocks.device.type != "cpu" \
            or blocks.shape[1] != k // per_block * block_bytes:
        raise TformerError(f"{ggml_type} blocks for an input width {k} are (out, {k // per_block * block_bytes}) "
                           f"uint8 (width a multiple of {per_block}); got {tuple(blocks.shape)} {blocks.dtype}")


PACKED = ("Q4_0", "Q4_1", "Q5_0", "Q8_0")  # repacked once for the kernel; the K-quants run in the file's layout


def repack(blocks: torch.Tensor, ggml_type: str) -> torch.Tensor:
    """A tensor's blocks as the file lays them out (N, row bytes) uint8 -> the kernel's layout, the same bytes
    regrouped so 8 blocks' scales widen in one instruction (per row: the scales, then the quants; csrc's
    is_packed32). The K-quants come back as they are."""
    if ggml_type not in PACKED:
        return blocks
    blocks = blocks.contiguous()
    out = torch.empty_like(blocks)
    _native.repack(blocks.data_ptr(), out.data_ptr(), blocks.shape[0], blocks.shape[1], FORMATS[ggml_type])
    return out


def _threads() -> int:
    return _THREADS or torch.get_num_threads()


def _run(x: torch.Tensor, blocks: torch.Tensor, fmt: int, threads: int) -> torch.Tensor:
    x = x.contiguous()
    blocks = blocks.contiguous()
    y = torch.empty(x.shape[0], blocks.shape[0], dtype=torch.float32)
    _native.matmul(x.data_ptr(), x.shape[0], x.shape[1], blocks.data_ptr(), blocks.shape[0], blocks.shape[1], fmt,
                   y.data_ptr(), threads)
    return y


# The op a compiled graph calls: declared with torch.library.Library and a CPU kernel rather than custom_op, whose
# Python wrapper layers cost 17 us a call against 9 here (a decode step makes ~200; measured on a 2-core EPYC).
_LIBRARY = torch.library.Library("tformer", "DEF")
_LIBRARY.define("ggml_matmul(Tensor x, Tensor blocks, int fmt) -> Tensor")


def _cpu_kernel(x: torch.Tensor, blocks: torch.Tensor, fmt: int) -> torch.Tensor:
    """x (M, K) fp32 @ blocks (N, row bytes) of format id ``fmt`` -> (M, N) fp32."""
    return _run(x, blocks, fmt, _threads())


_LIBRARY.impl("ggml_matmul", _cpu_kernel, "CPU")


@torch.library.register_fake("tformer::ggml_matmul")
def _(x: torch.Tensor, blocks: torch.Tensor, fmt: int) -> torch.Tensor:
    return x.new_empty(x.shape[0], blocks.shape[0])


ggml_matmul = torch.ops.tformer.ggml_matmul.default


def _attend_native(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, bias: torch.Tensor | None, causal: int,
                   scale: float) -> torch.Tensor:
    """q (B, H, Tq, D), k and v (B, H_kv, Tk, D) fp32, bias (B, H, Tq, Tk) fp32 (any strides but the last) or None
    -> (B, H, Tq, D): the C routine of tformer/model/csrc/attend_rows.h, whose module docstring states its
    arithmetic."""
    q, k, v = (t if t.stride(-1) == 1 else t.contiguous() for t in (q, k, v))
    if bias is not None and bias.stride(-1) != 1:
        bias = bias.contiguous()
    B, H, Tq, D = q.shape
    out = torch.empty(B, H, Tq, D, dtype=torch.float32)
    no_bias = (0, 0, 0)
    _native.attend(q.data_ptr(), k.data_ptr(), v.data_ptr(), 0 if bias is None else bias.data_ptr(), out.data_ptr(),
                   B, H, k.shape[1], Tq, k.shape[2], D, *q.stride()[:3], *k.stride()[:3], *v.stride()[:3],
                   *(no_bias if bias is None else bias.stride()[:3]), causal, _threads(), float(scale))
    return out


_LIBRARY.define("attend_rows(Tensor q, Tensor k, Tensor v, Tensor? bias, int causal, float scale) -> Tensor")
_LIBRARY.impl("attend_rows", _attend_native, "CPU")


@torch.library.register_fake("tformer::attend_rows")
def _(q, k, v, bias, causal: int, scale: float) -> torch.Tensor:
    return q.new_empty(q.shape)


def attend(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, bias: torch.Tensor | None, causal: int,
           scale: float) -> torch.Tensor:
    """Row-exact attention (tformer.model.attention.row_exact reads a mask into ``bias`` and ``causal``): q (B, H,
    Tq, D), k and v (B, H_kv, Tk, D), fp32 on the CPU; bias (B, H, Tq, Tk) with -inf where a key is hidden, or
    None; causal >= 0: query t also sees only keys j <= t + causal. -> (B, H, Tq, D)."""
    if torch.compiler.is_compiling():
        return attend_rows(q, k, v, bias, causal, scale)
    return _attend_native(q, k, v, bias, causal, scale)


attend_rows = torch.ops.tformer.attend_rows.default


def take_threads() -> int:
    """Give the kernel's pool the threads torch had and leave torch one: the kernel's workers and torch's OpenMP
    workers both spin between calls, and on a machine with as many cores as threads each steals the other's core
    (SmolLM2 Q4_1 on a 2-core AMD EPYC: 16 tok/s with both pools at 2 threads, 59 with torch at 1 and the kernel
    at 2; a 512-token prefill 297 against 396 tok/s). A model on the block path spends its time in the kernel;
    what torch still runs (norms, attention, a step's glue) is small at decode. Measured on 2 cores only: where
    there are many, torch's one thread may bound a long prefill's attention. Returns the kernel's thread count."""
    global _THREADS
    if not _THREADS:
        _THREADS = torch.get_num_threads()
        torch.set_num_threads(1)
    return _THREADS


def product(x: torch.Tensor, blocks: torch.Tensor, fmt: int) -> torch.Tensor:
    """matmul() for operands a Linear has already checked and repacked (x (M, K) fp32, ``repack``ed blocks of
    format id ``fmt``): the decode step's path, a few microseconds of Python per call instead of matmul()'s."""
    if torch.compiler.is_compiling():
        return ggml_matmul(x, blocks, fmt)
    return _run(x, blocks, fmt, _threads())


def matmul(x: torch.Tensor, blocks: torch.Tensor, ggml_type: str, threads: int | None = None) -> torch.Tensor:
    """x (M, K) fp32 times W^T -> (M, N) fp32, W the ``blocks`` as the file lays them out (repacked on each call:
    a Linear repacks once and calls product()); ``threads`` defaults to the kernel's."""
    if torch.compiler.is_compiling():
        return ggml_matmul(x, repack(blocks, ggml_type), FORMATS[ggml_type])
    _check(x, blocks, ggml_type)
    if threads is not None and not 1 <= threads <= 256:
        raise TformerError(f"the kernel runs on 1 to 256 threads, not {threads}")
    return _run(x, repack(blocks, ggml_type), FORMATS[ggml_type], threads or _threads())


__all__ = ["FORMATS", "PACKED", "attend", "attend_rows", "available", "compiler_found", "ggml_matmul", "matmul",
           "product", "repack", "simd", "take_threads", "unavailable_reason"]
