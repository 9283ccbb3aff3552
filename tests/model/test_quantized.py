"""Weight-only int8 / int4 Linears: torch's CPU kernels against the dequantise-then-F.linear reference, the
quantization error, quantize_model on whole models, and the ledger's weight bytes against the real tensors."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from tformer.adapt.quantize import dynamic_int8, quantize_model
from tformer.core.config import preset
from tformer.core.errors import TformerError
from tformer.cost.ledger import Workload, ledger
from tformer.cost.roofline import roofline
from tformer.machine.device import Device
from tformer.model import build
from tformer.model.path_choice import choose_paths
from tformer.model.quantized import Int4Linear, Int8Linear, QuantizedLinear, kernels, quantized_path, use_path

SHAPES = [(37, 64), (3, 192), (50, 128), (130, 256)]  # odd output widths; int4 pads rows to 16 for the kernel
LAYERS = [(Int8Linear, {}), (Int4Linear, {"group": 32}), (Int4Linear, {"group": 64})]


def _layer(cls, kw, n, k, bias):
    g = torch.Generator().manual_seed(n * k)
    w = torch.randn(n, k, generator=g)
    b = torch.randn(n, generator=g) if bias else None
    return w, cls.from_float(w, b, **kw)


@pytest.mark.parametrize("cls,kw", LAYERS, ids=["int8", "int4-g32", "int4-g64"])
@pytest.mark.parametrize("n,k", SHAPES)
@pytest.mark.parametrize("bias", [True, False])
def test_kernel_equals_the_reference(cls, kw, n, k, bias):
    if not kernels()[cls.bits]:
        pytest.skip("this PyTorch has no CPU kernel for it")
    _, layer = _layer(cls, kw, n, k, bias)
    for shape in [(1, k), (1, 1, k), (4, 3, k), (70, k)]:
        x = torch.randn(*shape, generator=torch.Generator().manual_seed(1))
        layer.path = "reference"
        want = layer(x)
        layer.path = "kernel"
        got = layer(x)
        assert got.shape == want.shape == (*shape[:-1], n) and got.dtype == torch.float32
        # The kernels multiply bf16 activations: bf16 rounding of the input, relative to the output's scale.
        torch.testing.assert_close(got, want, rtol=0, atol=2e-2 * want.abs().max().item())


@pytest.mark.parametrize("cls,kw,bound", [(Int8Linear, {}, 1 / 254), (Int4Linear, {"group": 32}, 1 / 29)])
def test_quantization_error_is_half_a_step(cls, kw, bound):
    w, layer = _layer(cls, kw, 24, 128, False)
    err = (layer.dequantized() - w).abs()
    rows = w.abs().amax(dim=1, keepdim=True) if cls is Int8Linear else \
        (w.view(24, -1, 32).amax(-1) - w.view(24, -1, 32).amin(-1)).repeat_interleave(32, dim=1)
    assert (err <= bound * rows * 1.01 + 1e-6).all()  # half a step of max|w|/127, or of range/15 (+ bf16 scale)


def test_kernel_layout_follows_a_load_of_new_weights():
    if not kernels()[4]:
        pytest.skip("this PyTorch has no int4 CPU kernel")
    w, layer = _layer(Int4Linear, {"group": 32}, 16, 64, True)
    layer.path = "kernel"
    x = torch.randn(2, 64)
    first = layer(x)  # builds and caches the kernel's layout
    layer.load_state_dict(Int4Linear.from_float(-w, torch.zeros(16), group=32).state_dict())
    got = layer(x)
    layer.path = "reference"
    want = layer(x)
    torch.testing.assert_close(got, want, rtol=0, atol=2e-2 * want.abs().max().item())
    assert not torch.allclose(got, first, atol=0.1)


def _tiny(**kw):
    return preset("gpt2", n_layers=2, d_model=64, n_heads=4, d_ff=128, vocab_size=50, max_positions=32, **kw)


@pytest.mark.parametrize("to,group,tol", [("int8", None, 0.02), ("int4", 32, 0.15), ("int4", 64, 0.15)])
def test_quantize_model_is_close_and_leaves_the_float_model(to, group, tol):
    torch.manual_seed(0)
    model = build(_tiny()).eval()
    before = {k: v.clone() for k, v in model.state_dict().items()}
    ids = torch.randint(0, 50, (2, 9))
    q = quantize_model(model, to, group)
    assert q.config.quantize == to and q.config.quant_group == group
    want = model(ids).logits
    got = q(ids).logits
    assert ((got - want).abs().max() / want.abs().max()).item() < tol
    assert all(torch.equal(before[k], v) for k, v in model.state_dict().items())
    assert model.lm_head.weight is model.tok_embed.weight  # still tied in the float model
    assert not any(p.dtype != torch.float32 for p in q.parameters())


def test_quantize_model_refusals():
    model = build(_tiny())
    with pytest.raises(TformerError, match="already quantized"):
        quantize_model(quantize_model(model, "int8"), "int4")
    with pytest.raises(TformerError, match="int3"):
        quantize_model(model, "int3")
    with pytest.raises(TformerError, match="not a supported int4 group size"):
        quantize_model(model, "int4", 48)
    odd = build(_tiny().replace(d_ff=96))
    with pytest.raises(TformerError, match=r"mlp\.down's input width 96.*\(32\)"):
        quantize_model(odd, "int4", 64)
    with pytest.raises(TformerError, match="recurrent|rnn|keep it in float"):
        preset("char-small").replace(arch="rnn", quantize="int8")


def test_dynamic_int8_baseline_swaps_every_linear():
    torch.manual_seed(0)
    model = build(_tiny()).eval()
    ids = torch.randint(0, 50, (1, 5))
    dq = dynamic_int8(model)
    names = [type(m).__name__ for m in dq.modules()]
    assert names.count("Linear") == 2 * 6 + 1  # q, k, v, o, up, down per layer + the head
    assert all(type(m).__module__.startswith("torch.ao") for m in dq.modules() if type(m).__name__ == "Linear")
    want = model(ids).logits
    assert ((dq(ids).logits - want).abs().max() / want.abs().max()).item() < 0.05


def _state_bytes(model) -> int:
    seen, total = set(), 0
    for v in model.state_dict().values():
        if v.data_ptr() not in seen:
            seen.add(v.data_ptr())
            total += v.numel() * v.element_size()
    return total


@pytest.mark.parametrize("to,group", [("none", None), ("int8", None), ("int4", 32), ("int4", 64)])
def test_ledger_weight_bytes_are_the_models_tensor_bytes(to, group):
    config = _tiny(quantize=to, quant_group=group)
    model = build(config)
    lg = ledger(config, Workload(phase="decode", batch=1, seq=1))
    assert lg.memory["weights"] == _state_bytes(model)
    # A decode step reads each Linear's stored bytes once (embeddings: the looked-up rows only).
    linear_bytes = sum(t.numel() * t.element_size() for m in model.modules()
                       if isinstance(m, (torch.nn.Linear, QuantizedLinear)) for t in m.state_dict().values())
    assert sum(op.weight_bytes for op in lg.ops if op.dims is not None and op.dims.weight) == linear_bytes


def test_decode_roofline_time_falls_with_the_weight_bytes():
    device = Device(name="test", kind="custom", peak_flops={"fp32": 1e12}, bandwidth=1e10)
    times = {}
    for to in ("none", "int8", "int4"):
        lg = ledger(preset("gpt2", quantize=to), Workload(phase="decode", batch=1, seq=1))
        times[to] = roofline(lg, device, model="peak").time_s
    assert times["none"] > 3 * times["int8"] > 3 * 1.5 * times["int4"]


def test_the_path_is_the_reference_until_the_kernel_is_asked_for():
    """No timing picks a path: the pass only prepares what was asked (the kernel's operands packed, for a graph
    traced next), and a layer it never visited computes the same; the context manager puts each layer back."""
    _, layer = _layer(Int8Linear, {}, 37, 64, True)
    x = torch.randn(5, 64)
    with torch.no_grad():
        unvisited = layer(x)
        choose_paths(layer)
        assert layer.path == "reference" and layer._packed is None
        assert torch.equal(layer(x), F.linear(x, layer.dequantized(), layer.bias))
        assert torch.equal(layer(x), unvisited)
        if kernels()[8]:
            with quantized_path(layer, "kernel"):
                choose_paths(layer)
                assert layer._packed is not None
                assert not torch.equal(layer(x), unvisited)  # bf16 activations: another arithmetic
            assert layer.path == "reference" and torch.equal(layer(x), unvisited)
    with pytest.raises(TformerError, match="quantized path 'auto' is unknown; choose one of: reference, kernel"):
        use_path(layer, "auto")


def test_a_kernel_this_torch_lacks_is_one_line_at_the_pass(monkeypatch):
    from tformer.model import quantized as Q

    monkeypatch.setitem(Q._KERNELS, 8, False)
    _, layer = _layer(Int8Linear, {}, 8, 32, False)
    use_path(layer, "kernel")
    with pytest.raises(TformerError, match="torch's int8 CPU kernel, which this torch lacks; drop --bf16-kernel"):
        choose_paths(layer)


def test_the_pass_counts_no_flops():
    """The pass runs outside any dispatch mode, so a FlopCounterMode around it and a call counts only the call's
    product."""
    from torch.utils.flop_counter import FlopCounterMode

    _, layer = _layer(Int8Linear, {}, 48, 64, False)
    with torch.no_grad(), FlopCounterMode(display=False) as counter:
        choose_paths(layer)
        layer(torch.randn(1, 64))
    assert counter.get_total_flops() == 2 * 48 * 64
