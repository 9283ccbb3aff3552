"""GGUF's Q8_0 and Q4_1 blocks kept in tformer's Linears (tformer.model.block_quantized): quantized as gguf-py
quantizes (the format's own Python package is the reference), widened exactly as ggml widens, the int4 kernel's
two-plane Q8_0 and zero-shifted Q4_1 equal to that widening, and the ledger's bytes equal to the state dict's."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from tformer.core.config import ModelConfig
from tformer.core.errors import TformerError
from tformer.cost.architecture import describe
from tformer.cost.quantized import architecture_buffers
from tformer.model import build
from tformer.model.block_quantized import Q4_1Linear, Q8_0Linear
from tformer.model.quantized import KERNEL_DTYPE, kernels

gguf = pytest.importorskip("gguf")
LAYERS = {"q8_0": (Q8_0Linear, gguf.GGMLQuantizationType.Q8_0), "q4_1": (Q4_1Linear, gguf.GGMLQuantizationType.Q4_1)}


def _weight(n, k, seed=0):
    g = torch.Generator().manual_seed(seed)
    w = torch.randn(n, k, generator=g) * 0.05
    w[0, :32] = 0.0  # an all-zero block: d = 0
    w[1, 3] = 2.5  # one outlier in a block
    return w


@pytest.mark.parametrize("layout", LAYERS)
def test_quantized_and_widened_as_gguf_py(layout):
    cls, ggml_type = LAYERS[layout]
    w = _weight(40, 96)
    module = cls.from_float(w)
    want = gguf.quants.dequantize(gguf.quants.quantize(w.numpy(), ggml_type), ggml_type)
    assert np.array_equal(module.dequantized().numpy(), want)


@pytest.mark.parametrize("layout", LAYERS)
def test_the_kernels_planes_are_the_blocks(layout):
    """Written out in fp32, the planes the int4 kernel reads give W x exactly as the widened blocks do."""
    cls, _ = LAYERS[layout]
    module = cls.from_float(_weight(24, 64, seed=1))
    values, scale, zero = module._planes()
    n, k2 = values.shape
    group = k2 // scale.shape[1]
    widened = ((values.float().view(n, -1, group) - 8) * scale[..., None] + zero[..., None]).view(n, k2)
    x = torch.randn(3, module.in_features, dtype=torch.float64)
    want = x @ module.dequantized().double().T
    got = module._kernel_input(x) @ widened.double().T
    assert torch.allclose(got, want, rtol=0, atol=1e-9)


@pytest.mark.skipif(not kernels()[4], reason="this torch has no int4 CPU kernel")
@pytest.mark.parametrize("layout", LAYERS)
@pytest.mark.parametrize("rows", [1, 5, 70])
def test_kernel_equals_the_reference_within_bf16(layout, rows):
    cls, _ = LAYERS[layout]
    module = cls.from_float(_weight(48, 128, seed=2), bias=torch.randn(48))
    x = torch.randn(rows, 128)
    module.path = "reference"
    want = module(x)
    module.path = "kernel"
    got = module(x)
    # the input and the scales rounded to bf16 (8 bits of mantissa): a few parts in a thousand of the output scale
    assert (got - want).abs().max() <= 3 * torch.finfo(KERNEL_DTYPE).eps * want.abs().max()


def _config(**kw):
    fields = dict(arch="decoder", vocab_size=64, d_model=64, n_heads=4, n_kv_heads=2, n_layers=2, d_ff=96,
                  max_positions=32, position="rope", norm="rmsnorm", mlp="swiglu", bias=False)
    return ModelConfig.from_dict({**fields, **kw})


@pytest.mark.parametrize("layers,head", [("q4_1", "q8_0"), ("q8_0", "q8_0"), ("q4_1", "none"), ("none", "q4_1")])
def test_ledger_buffers_are_the_models(layers, head):
    config = _config(quantize=layers, quantize_head=head)
    state = build(config, device="meta").state_dict()
    buffers = architecture_buffers(describe(config))
    for name, (shape, dtype, size) in buffers.items():
        assert tuple(state[name].shape) == shape and str(state[name].dtype) == f"torch.{dtype}", name
        assert state[name].element_size() == size
    kinds = {type(m).__name__ for m in build(config, device="meta").modules()}
    assert ("Q8_0Linear" in kinds) == ("q8_0" in (layers, head))
    assert ("Q4_1Linear" in kinds) == ("q4_1" in (layers, head))


def test_bytes_per_weight_are_the_formats():
    """34 bytes per 32 weights for Q8_0, 20 for Q4_1: what the GGUF file holds."""
    for cls, per32 in ((Q8_0Linear, 34), (Q4_1Linear, 20)):
        module = cls(128, 16)
        stored = sum(b.numel() * b.element_size() for b in module.buffers())
        assert stored == 16 * 128 // 32 * per32


def test_refusals_are_one_line():
    with pytest.raises(TformerError, match="multiple of 32"):
        describe(_config(quantize="q4_1", d_ff=100))  # the down projection's input
    with pytest.raises(TformerError, match="quant_group"):
        _config(quantize="q8_0", quant_group=32)
    with pytest.raises(TformerError, match="inf or NaN"):
        Q8_0Linear.from_float(torch.full((2, 32), float("nan")))


@pytest.mark.slow
@pytest.mark.skipif(not kernels()[4], reason="this torch has no int4 CPU kernel")
def test_a_compiled_step_runs_the_kernel_prepared_before_tracing():
    """The compiled decode step reads the packed operands choose_paths left (nothing can be packed inside a graph),
    and decodes what the eager model decodes on the same path."""
    from tformer.adapt.quantize import quantize_model
    from tformer.generate import generate
    from tformer.model.quantized import use_path

    torch.manual_seed(0)
    model = quantize_model(build(_config()).eval(), "q4_1")
    use_path(model, "kernel")
    compiled = generate(model, [[1, 2, 3]], max_new_tokens=12, stop_tokens=[], compile=True).sequences[0]
    blocks = [m for m in model.modules() if isinstance(m, Q4_1Linear)]
    assert blocks and all(m._packed is not None for m in blocks)  # packed before tracing
    eager = generate(model, [[1, 2, 3]], max_new_tokens=12, stop_tokens=[]).sequences[0]
    assert compiled == eager
