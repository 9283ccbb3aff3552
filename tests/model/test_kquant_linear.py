"""GGUF's Q5_0, Q4_K and Q6_K blocks kept in tformer's Linears (tformer.model.kquant_linear): what they store
decodes as gguf-py decodes the same bytes, Q5_0 is written as gguf-py writes it, the int4 kernel's planes widen
to the same weights, and the ledger's bytes equal the state dict's for a model mixing formats per Linear."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from tformer.core.config import ModelConfig
from tformer.core.errors import TformerError
from tformer.cost.architecture import describe
from tformer.cost.quantized import architecture_buffers
from tformer.model import build
from tformer.model.kquant_linear import LAYOUTS
from tformer.model.quantized import INT4_MID, kernels, quantized_path

gguf = pytest.importorskip("gguf")
GGML = {name: gguf.GGMLQuantizationType[cls.ggml_type] for name, cls in LAYOUTS.items()}


def _random_blocks(module, seed=0) -> torch.Tensor:
    """Any bytes, with every fp16 scale small and finite: the blocks a file could hold."""
    g = torch.Generator().manual_seed(seed)
    raw = torch.randint(0, 256, module.blocks.shape, dtype=torch.uint8, generator=g).view(-1, module.block_bytes)
    scales = (torch.rand(raw.shape[0], 2, generator=g) * 4e-3 + 1e-3).to(torch.float16).view(torch.uint8)
    where = {"q5_0": slice(0, 2), "q4_k": slice(0, 4), "q6_k": slice(208, 210)}[module.layout]
    raw[:, where] = scales[:, :where.stop - where.start]
    return raw.view(module.blocks.shape)


@pytest.mark.parametrize("layout", LAYOUTS)
def test_any_blocks_widen_as_gguf_py_reads_them(layout):
    module = LAYOUTS[layout](512, 48)
    module.set_blocks(_random_blocks(module))
    want = gguf.quants.dequantize(module.blocks.numpy(), GGML[layout])
    assert np.array_equal(module.dequantized().numpy(), want)


def test_q5_0_is_written_as_gguf_py_writes_it():
    w = torch.randn(24, 256) * 0.05
    w[0, :32] = 0.0  # an all-zero block: d = 0
    w[1, 5] = -3.0  # the extreme is negative: d takes its sign
    module = LAYOUTS["q5_0"].from_float(w)
    want = gguf.quants.quantize(w.numpy(), GGML["q5_0"])
    assert module.blocks.numpy().tobytes() == want.tobytes()


@pytest.mark.parametrize("layout,error", [("q4_k", 0.10), ("q6_k", 0.03)])
def test_k_quants_are_written_so_gguf_py_reads_back_the_weight(layout, error):
    """tformer's one-pass K-quant writer: gguf-py decodes its bytes to what the Linear computes with, and that is
    the weight within the format's resolution (relative RMS error; 4 and 6 bits)."""
    w = torch.randn(32, 512) * 0.05
    module = LAYOUTS[layout].from_float(w)
    back = gguf.quants.dequantize(module.blocks.numpy(), GGML[layout])
    assert np.array_equal(module.dequantized().numpy(), back)
    assert float(((torch.from_numpy(back) - w).pow(2).mean().sqrt() / w.std())) < error


@pytest.mark.skipif(not kernels()[4], reason="this PyTorch has no int4 CPU kernel")
@pytest.mark.parametrize("layout", LAYOUTS)
def test_kernel_planes_compute_the_same_weight(layout):
    """The kernel's form, (v - 8) * scale + zero per group of 32 over the input as _kernel_input lays it out (Q5_0:
    twice; Q6_K: four times, each sub-block's half zeroed where the other's scale applies), is the decoded weight,
    in fp64; the kernel itself then agrees within its bf16 rounding of input and scales."""
    module = LAYOUTS[layout](512, 40)
    module.set_blocks(_random_blocks(module, seed=1))
    values, scale, zero = module._planes()
    g = module.group
    n, width = values.shape
    planes = ((values.double().view(n, width // g, g) - INT4_MID) * scale.double()[..., None]
              + zero.double()[..., None]).view(n, width)
    spread = module._kernel_input(torch.eye(512, dtype=torch.float64))  # (in, width): where each input lands
    assert torch.allclose(planes @ spread.T, module.dequantized().double(), rtol=0, atol=1e-9)
    x = torch.randn(3, 512)
    with torch.no_grad():
        module.path = "reference"
        ref = module(x)
        module.path = "kernel"
        got = module(x)
    assert (got - ref).abs().max() < 0.02 * ref.abs().max()


MIXED = ["q:q5_0,k:q5_0,v:q8_0,o:q4_k,gate:q5_0,up:q5_0,down:q6_k", "q:q4_1,down:q4_k"]


def _mixed(**change):
    fields = dict(arch="decoder", n_layers=2, d_model=256, n_heads=2, n_kv_heads=1, d_ff=512, vocab_size=96,
                  norm="rmsnorm", position="rope", gated_mlp=True, quantize="mixed", quantize_head="q8_0",
                  quantize_layers=list(MIXED))
    return ModelConfig(**{**fields, **change})


def test_a_mixed_model_holds_each_linear_in_its_format_and_the_ledger_sizes_them():
    c = _mixed()
    model = build(c)
    layer0, layer1 = model.decoder.layers
    assert [type(m).__name__ for m in (layer0.attn.q_proj, layer0.attn.v_proj, layer0.attn.o_proj,
                                       layer0.mlp.down, layer1.attn.q_proj, layer1.attn.k_proj, layer1.mlp.down)] == \
        ["Q5_0Linear", "Q8_0Linear", "Q4_KLinear", "Q6_KLinear", "Q4_1Linear", "Linear", "Q4_KLinear"]
    sd = model.state_dict()
    buffers = architecture_buffers(describe(c))
    assert buffers and all(tuple(sd[k].shape) == shape and sd[k].dtype == getattr(torch, dtype)
                           for k, (shape, dtype, _) in buffers.items())
    assert sd["decoder.layers.0.mlp.down.blocks"].numel() == 256 * 512 // 256 * 210  # Q6_K: 210 bytes per 256
    with torch.no_grad(), quantized_path(model, "reference"):
        logits = model(torch.tensor([[1, 2, 3, 4]])).logits
    assert logits.shape == (1, 4, 96) and bool(logits.isfinite().all())


@pytest.mark.parametrize("change,words", [
    ({"quantize_layers": None}, "quantize='mixed' and quantize_layers go together"),
    ({"quantize": "q8_0"}, "quantize='mixed' and quantize_layers go together"),
    ({"quantize_layers": MIXED[:1]}, "gives 1 layers for n_layers=2"),
    ({"quantize_layers": ["q:q5_0,q:q8_0", ""]}, "gives q twice"),
    ({"quantize_layers": ["qkv:q5_0", ""]}, "'qkv:q5_0' is not role:format"),
    ({"quantize_layers": ["q:int4", ""]}, "'q:int4' is not role:format"),
    ({"quantize_head": "mixed"}, "quantize_head"),
])
def test_bad_mixed_quantization_is_one_line(change, words):
    with pytest.raises(TformerError, match=words.replace("(", r"\(").replace(")", r"\)")) as err:
        _mixed(**change)
    assert "\n" not in str(err.value)


def test_a_width_the_k_quant_blocks_do_not_divide_is_refused():
    with pytest.raises(TformerError, match="q4_k keeps rows in blocks of 256"):
        describe(ModelConfig(arch="decoder", n_layers=1, d_model=128, n_heads=2, d_ff=256, vocab_size=50,
                             quantize="q4_k"))


@pytest.mark.parametrize("head", ["q8_0", "q4_1", "q5_0", "q4_k", "q6_k"])
def test_a_tied_head_in_blocks_is_the_token_table_too(head):
    """One copy in blocks serves the head's product and the lookup (llama.cpp's token_embd): the model holds no
    float table, each id's embedding is its row of the head widened, and the ledger's weight bytes are the state
    dict's."""
    from tformer.cost.ledger import Workload, ledger

    c = ModelConfig(arch="decoder", n_layers=1, d_model=256, n_heads=2, d_ff=512, vocab_size=96, norm="rmsnorm",
                    position="rope", tied_embeddings=True, scale_embeddings=True, quantize="q8_0",
                    quantize_head=head)
    model = build(c).eval()
    assert model.tok_embed is None and not any(k.startswith("tok_embed") for k in model.state_dict())
    ids = torch.tensor([[5, 0, 95, 5]])
    with torch.no_grad():
        want = model.lm_head.dequantized()[ids] * 16.0  # scale_embeddings: sqrt(256)
        assert torch.equal(model.embed(ids), want)
    stored = sum(t.numel() * t.element_size() for t in model.state_dict().values())
    assert ledger(c, Workload(phase="decode", batch=1, seq=9, context=8)).memory["weights"] == stored
    assert model.num_parameters() == build(c.replace(quantize="none", quantize_head=None)).num_parameters()
