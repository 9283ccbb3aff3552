"""Weight-only quantized Linears: int8 per output row, int4 in groups of inputs (config.quantize); GGUF's
32-weight blocks (q8_0, q4_1) build on these in tformer.model.block_quantized.

Stored layouts (plain tensors, safetensors-ready, the same on every CPU; tformer.cost.quantized sizes them):
    Int8Linear  weight (out, in) int8, scale (out,) fp32:                 W = weight * scale[:, None]
    Int4Linear  weight (out, in/2) uint8 (input 2j low nibble, 2j+1 high), scale and zero (out, in/group) bf16:
                W[:, i] = (q[:, i] - 8) * scale[:, i // group] + zero[:, i // group],  q in 0..15

Two paths compute y = x W^T + b, and ``path`` says which; nothing chooses between them by timing, because they
do not compute the same numbers. ``reference`` (the default): dequantise W to fp32 exactly, then F.linear: the
model's own arithmetic, equal to the dequantized model's, the one on CUDA and wherever a kernel is missing.
``kernel`` (asked for: ``quantized_path``, the commands' --bf16-kernel): torch's CPU weight-only kernels,
``torch._weight_int8pack_mm`` and ``torch._weight_int4pack_mm_for_cpu`` (int4 after repacking into
``torch._convert_weight_to_int4pack_for_cpu``'s layout, which depends on the CPU's vector width and so is never
saved: it is rebuilt from the stored weight when that changes). Both kernels are vectorised for bf16
activations and run fp32 ones element by element, so the kernel path rounds the input to bf16 and returns its
bf16 product widened: it equals the reference within bf16 rounding (about 3e-3 relative), which tests hold, and
its logits come in steps of bf16 (0.125 near 25), so a greedy pick between two close tokens can differ from the
reference's. That is why a speed choice may never pick it: when it was chosen per bucket of rows by timing, the
same prompt decoded alone (one row) and in a served batch (eight rows) took different arithmetic and answered
differently (issue 45). The kernel's rows do not depend on each other, so with the kernel asked for, a served
batch still computes what one row alone computes.
``blocks`` (GGUF's block formats only; use_path(model, "blocks"), which a GGUF file's --gguf-weights auto, the
decoding commands' default, and kernel take): tformer's block-quantized kernel (tformer.model.ggml_kernel) on the
file's own block bytes (repacked once, kept beside the stored tensors as the non-persistent buffer ``repacked``),
activations rounded per block of 32 to 8 bits as llama.cpp rounds them: llama.cpp's arithmetic, near the memory
floor, and the same for a row whatever batch it is in; the same call puts attention on row-exact attention, so
what reaches the kernel does not depend on the batch either.
"""

from __future__ import annotations

import contextlib

import torch
import torch.nn.functional as F
from torch import nn

from tformer.core.errors import TformerError
from tformer.model import ggml_kernel

KERNEL_DTYPE = torch.bfloat16  # the activation dtype the CPU kernels are vectorised for
INT4_MID = 8  # the kernel's int4 values 0..15 are centred on 8
_INT4_N_MULTIPLE = 16  # the int4 CPU packer takes whole blocks of 16 output rows; rows beyond pad with zeros
PATHS = ("reference", "kernel", "blocks")


def kernels() -> dict[str, bool]:
    """Which CPU kernels this PyTorch has (8, 4 -> available)."""
    ops = torch.ops.aten
    return {8: hasattr(ops, "_weight_int8pack_mm"),
            4: hasattr(ops, "_weight_int4pack_mm_for_cpu") and hasattr(ops, "_convert_weight_to_int4pack_for_cpu")}


_KERNELS = kernels()


def nibble_pairs(packed: torch.Tensor, rows: int, cols: int) -> torch.Tensor:
    """(rows, cols/2) bytes, input 2j in byte j's low nibble and 2j+1 in its high -> (rows, cols) values 0..15."""
    return torch.stack((packed & 0x0F, packed >> 4), dim=-1).view(rows, cols)


class QuantizedLinear(nn.Module):
    """Shared by the weight-only quantized Linears: the bias, the path choice, quantizing a float weight."""

    bits = 0
    kernel_bits = 0  # which of torch's CPU kernels (8 or 4, see kernels()) the kernel path runs on
    layout = ""
    ggml_type = ""  # a GGUF block format (Q8_0, Q4_1, ...): the blocks path runs it (tformer.model.ggml_kernel)

    def __init__(self, d_in: int, d_out: int, bias: bool):
        super().__init__()
        self.in_features, self.out_features = d_in, d_out
        self.bias = nn.Parameter(torch.zeros(d_out)) if bias else None
        self.path = "reference"  # "kernel": torch's bf16 CPU kernel, asked for (quantized_path, --bf16-kernel)
        self._packed: tuple | None = None  # (key of the stored tensors, what the kernel reads)

    @classmethod
    def from_float(cls, weight: torch.Tensor, bias: torch.Tensor | None = None, group: int | None = None):
        """The quantized Linear of a float ``weight`` (out, in) and ``bias``, on weight's device."""
        out, d_in = weight.shape
        with torch.device(weight.device):
            module = cls(d_in, out, bias is not None, **({"group": group} if cls.layout == "int4" else {}))
        module.quantize_(weight)
        if bias is not None:
            module.bias.data.copy_(bias.detach())
        return module

    def dequantized(self) -> torch.Tensor:
        raise NotImplementedError

    def quantize_(self, weight: torch.Tensor) -> None:
        raise NotImplementedError

    def prepare(self) -> None:
        """Before decoding and before tracing (tformer.model.path_choice.choose_paths): on the kernel path, check the
        kernel exists here and pack its operands now, so a graph compiled next reads them as constants."""
        if self.path == "blocks":
            self._check_blocks_path()
            self.kernel_blocks()
            return
        if self.path != "kernel":
            return
        device = next(self.buffers(recurse=False)).device
        if not _KERNELS[self.kernel_bits] or device.type != "cpu":
            raise TformerError(f"the bf16 kernel path needs torch's int{self.kernel_bits} CPU kernel, which "
                               f"{'this torch lacks' if device.type == 'cpu' else f'a {device.type} model cannot run'}; "
                               "drop --bf16-kernel")
        self._kernel_operands()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.path == "blocks":
            return self._run_blocks(x)
        return self._run(x, self.path == "kernel")

    def _check_blocks_path(self) -> None:
        if self.ggml_type not in ggml_kernel.FORMATS:
            raise TformerError(f"the block kernel runs GGUF's {', '.join(ggml_kernel.FORMATS)} blocks; a "
                               f"{self.layout} Linear has none: use the reference path")
        if not ggml_kernel.available():
            raise TformerError(ggml_kernel.unavailable_reason())
        if next(self.buffers(recurse=False)).device.type != "cpu":
            raise TformerError("the block kernel runs on the CPU; a model on another device takes the reference path")

    def raw_blocks(self) -> torch.Tensor:
        """W as a GGUF file holds it: (out, row bytes) uint8 of ``ggml_type`` blocks."""
        raise NotImplementedError

    _repacked_key: tuple | None = None  # the stored tensors' key when ``repacked`` was built

    def kernel_blocks(self) -> torch.Tensor:
        """raw_blocks() repacked once for the block kernel (ggml_kernel.repack), rebuilt when the stored tensors
        change; prepare() builds it before a graph is traced. A non-persistent buffer, not a plain attribute: a
        compiled graph takes it as an input with one tensor guard (a tuple attribute cost a guard per item, and
        guards are evaluated every step)."""
        if self.ggml_type not in ggml_kernel.PACKED:  # the K-quants run in the file's own layout
            return self.raw_blocks()
        if torch.compiler.is_compiling():
            if getattr(self, "repacked", None) is None:
                raise TformerError("a GGUF Linear on the blocks path is traced unprepared; call "
                                   "tformer.model.path_choice.choose_paths(model) before compiling")
            return self.repacked
        key = self._stored_key()
        if self._repacked_key != key or getattr(self, "repacked", None) is None:
            self.register_buffer("repacked", ggml_kernel.repack(self.raw_blocks(), self.ggml_type), persistent=False)
            self._repacked_key = self._stored_key()
        return self.repacked

    def share_repacked(self, rows: torch.Tensor) -> None:
        """Take ``rows`` (this Linear's rows of a stack's repacked blocks: tformer.model.stacked_products) as the
        repacked copy, so the weights are held once; kernel_blocks() rebuilds its own if the stored tensors change."""
        self.register_buffer("repacked", rows, persistent=False)
        self._repacked_key = self._stored_key()

    def _run_blocks(self, x: torch.Tensor) -> torch.Tensor:
        """y = x W^T + b on the block kernel: x in fp32 (the kernel rounds it to 8 bits per block of 32). prepare()
        checked the blocks once; a decode step calls this ~200 times, so nothing else is checked here."""
        rows = x.reshape(-1, self.in_features)
        y = ggml_kernel.product(rows if rows.dtype == torch.float32 else rows.float(), self.kernel_blocks(),
                                ggml_kernel.FORMATS[self.ggml_type])
        if self.bias is not None:
            y += self.bias
        y = y.view(*x.shape[:-1], self.out_features)
        return y if x.dtype == torch.float32 else y.to(x.dtype)

    def _run(self, x: torch.Tensor, kernel: bool) -> torch.Tensor:
        """y = x W^T + b through the kernel or the reference (dequantise, then F.linear)."""
        if not kernel:
            return F.linear(x, self.dequantized().to(x.dtype), self.bias)
        y = self._kernel(x.reshape(-1, self.in_features).to(KERNEL_DTYPE).contiguous())  # (rows, out) bf16
        # One op back to x's dtype: adding the fp32 bias to the bf16 product promotes it (decode calls this ~50 times
        # a token, so each separate cast or add shows).
        y = torch.add(self.bias, y) if self.bias is not None and self.bias.dtype == x.dtype else y.to(x.dtype)
        if self.bias is not None and self.bias.dtype != x.dtype:
            y = y + self.bias.to(x.dtype)
        return y.view(*x.shape[:-1], self.out_features)

    def _stored_key(self) -> tuple:
        # A load_state_dict copy bumps the version counter in place, a reassigned buffer has a new pointer. Read from
        # the module's own buffer dict: named_buffers() walks a generator with a memo set, and a decode step asks
        # ~200 times (measured on SmolLM2's kernel step: ~1.5 ms of 17).
        return tuple((t.data_ptr(), t._version) for name, t in self._buffers.items()
                     if t is not None and name != "repacked")

    def _kernel_operands(self):
        if torch.compiler.is_compiling():  # prepare() packed them; data pointers cannot be read in a graph
            if self._packed is None:
                raise TformerError("a quantized Linear on its kernel path is traced unprepared; call "
                                   "tformer.model.path_choice.choose_paths(model) before compiling")
            return self._packed[1]
        key = self._stored_key()
        if self._packed is None or self._packed[0] != key:
            self._packed = (key, self._pack())
        return self._packed[1]

    def extra_repr(self) -> str:
        return f"in_features={self.in_features}, out_features={self.out_features}, bias={self.bias is not None}"


def use_path(model, path: str) -> int:
    """Every quantized Linear of ``model`` on ``path`` ("reference", "kernel" or "blocks": only those holding a
    format the block kernel runs move to it); returns how many moved."""
    if path not in PATHS:
        raise TformerError(f"quantized path {path!r} is unknown; choose one of: {', '.join(PATHS)}")
    modules = [m for m in model.modules() if isinstance(m, QuantizedLinear)
               and (path != "blocks" or m.ggml_type in ggml_kernel.FORMATS)]
    for m in modules:
        m.path = path
    # The block kernel's rows do not depend on their batch; its attention layers follow, so that a row's numbers
    # never do (tformer.model.attention.row_exact: served equals generated under 8-bit rounding).
    for m in _row_exact_layers(model):
        m.row_exact = path == "blocks" and bool(modules)
    return len(modules)


def _row_exact_layers(model) -> list:
    """The attention layers that can run row-exact (MultiHeadAttention.row_exact_possible; read by attribute: the
    attention package imports this one)."""
    return [m for m in model.modules() if getattr(m, "row_exact_possible", False)]


@contextlib.contextmanager
def quantized_path(model, path: str):
    """Every quantized Linear of ``model`` on ``path`` for the duration, then back to the path each had: how tests
    and benches compare the paths on one model."""
    before = {m: m.path for m in model.modules() if isinstance(m, QuantizedLinear)}
    attention = {m: m.row_exact for m in _row_exact_layers(model)}
    use_path(model, path)
    try:
        yield model
    finally:
        for m, p in before.items():
            m.path = p
        for m, on in attention.items():
            m.row_exact = on


class Int8Linear(QuantizedLinear):
    """Symmetric int8 per output row: scale = max |W[r, :]| / 127, q = round(W / scale)."""

    bits = kernel_bits = 8
    layout = "int8"

    def __init__(self, d_in: int, d_out: int, bias: bool = True):
        super().__init__(d_in, d_out, bias)
        self.register_buffer("weight", torch.zeros(d_out, d_in, dtype=torch.int8))
        self.register_buffer("scale", torch.ones(d_out))

    def quantize_(self, weight: torch.Tensor) -> None:
        w = weight.detach().float()
        scale = (w.abs().amax(dim=1) / 127).clamp(min=torch.finfo(torch.float32).tiny)
        self.weight.copy_(torch.round(w / scale[:, None]).clamp(-127, 127).to(torch.int8))
        self.scale.copy_(scale)

    def dequantized(self) -> torch.Tensor:
        return self.weight.float() * self.scale[:, None]

    def _pack(self):
        return self.scale.to(KERNEL_DTYPE)

    def _kernel(self, x: torch.Tensor) -> torch.Tensor:
        return torch._weight_int8pack_mm(x, self.weight, self._kernel_operands())


class Int4KernelLinear(QuantizedLinear):
    """A quantized Linear whose kernel path is torch's int4 CPU kernel: a subclass says, through ``_planes``, which
    4-bit values and per-group scale and zero give W x (Int4Linear directly; GGUF's blocks after a rewrite)."""

    kernel_bits = 4
    group = 32

    def _planes(self) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """4-bit values (out, in') 0..15 and fp32 scale and zero (out, in'/group) with W x = sum over the groups of
        ((values - 8) * scale + zero) x', x' the input as _kernel_input gives it."""
        raise NotImplementedError

    def _kernel_input(self, x: torch.Tensor) -> torch.Tensor:
        return x

    def _pack(self):
        values, scale, zero = self._planes()
        pad = -self.out_features % _INT4_N_MULTIPLE
        packed = torch._convert_weight_to_int4pack_for_cpu(F.pad(values.to(torch.int32), (0, 0, 0, pad)), 1)
        # (groups, out, 2): each group's scale and zero, the layout the kernel reads.
        scale_zero = torch.stack((scale, zero), dim=-1).transpose(0, 1)
        return packed, F.pad(scale_zero, (0, 0, 0, pad)).to(KERNEL_DTYPE).contiguous()

    def _kernel(self, x: torch.Tensor) -> torch.Tensor:
        packed, scale_zero = self._kernel_operands()
        y = torch._weight_int4pack_mm_for_cpu(self._kernel_input(x), packed, self.group, scale_zero)
        return y[:, :self.out_features] if y.shape[1] != self.out_features else y


def pack_pairs(values: torch.Tensor) -> torch.Tensor:
    """(rows, cols) values 0..15 -> (rows, cols/2) bytes, input 2j in byte j's low nibble and 2j+1 in its high."""
    return values[:, 0::2] | (values[:, 1::2] << 4)


class Int4Linear(Int4KernelLinear):
    """Asymmetric int4 in groups of ``group`` inputs per row: the group's range [lo, hi] cut into 15 steps,
    scale = (hi - lo) / 15, zero = lo + 8 * scale, q = round((W - lo) / scale)."""

    bits = 4
    layout = "int4"

    def __init__(self, d_in: int, d_out: int, bias: bool = True, group: int = 32):
        super().__init__(d_in, d_out, bias)
        if d_in % group or d_in % 2:
            raise TformerError(f"int4 group {group} does not divide this Linear's input width {d_in}; "
                               "choose a group that does")
        self.group = group
        self.register_buffer("weight", torch.zeros(d_out, d_in // 2, dtype=torch.uint8))
        self.register_buffer("scale", torch.ones(d_out, d_in // group, dtype=torch.bfloat16))
        self.register_buffer("zero", torch.zeros(d_out, d_in // group, dtype=torch.bfloat16))

    def quantize_(self, weight: torch.Tensor) -> None:
        n, k, g = *weight.shape, self.group
        w = weight.detach().float().view(n, k // g, g)
        lo, hi = w.amin(dim=-1), w.amax(dim=-1)
        # The scale and zero are rounded to bf16 first, so q is chosen against the values dequantisation uses.
        scale = ((hi - lo) / 15).clamp(min=1e-8).to(torch.bfloat16)
        zero = (lo + INT4_MID * scale.float()).to(torch.bfloat16)
        start = zero.float() - INT4_MID * scale.float()
        q = torch.round((w - start[..., None]) / scale.float()[..., None]).clamp(0, 15).to(torch.uint8).view(n, k)
        self.weight.copy_(pack_pairs(q))
        self.scale.copy_(scale)
        self.zero.copy_(zero)

    def values(self) -> torch.Tensor:
        """The 4-bit values q (out, in), 0..15."""
        return nibble_pairs(self.weight, self.out_features, self.in_features)

    def dequantized(self) -> torch.Tensor:
        n, k, g = self.out_features, self.in_features, self.group
        q = self.values().float().view(n, k // g, g)
        return ((q - INT4_MID) * self.scale.float()[..., None] + self.zero.float()[..., None]).view(n, k)

    def _planes(self):
        return self.values(), self.scale.float(), self.zero.float()

    def extra_repr(self) -> str:
        return super().extra_repr() + f", group={self.group}"


__all__ = ["KERNEL_DTYPE", "PATHS", "Int4KernelLinear", "Int4Linear", "Int8Linear", "QuantizedLinear", "kernels",
           "nibble_pairs", "pack_pairs", "quantized_path", "use_path"]
