"""FlopCounter counts what the model runs on every supported torch: SDPA's fused CPU kernel (no formula in
torch before 2.15) counts the same as the explicit matmuls of the reference path, forward and backward, and
an LSTM counts its gate matmuls whether or not oneDNN would have fused them."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from torch.utils.flop_counter import FlopCounterMode

from tformer.core.config import ModelConfig
from tformer.cost.ledger import Workload, ledger
from tformer.measure.flops import FORMULAS, FlopCounter, count_flops
from tformer.model import build

B, H, T, D = 2, 3, 7, 8


def _reference(q, k, v, causal):
    s = q @ k.transpose(-1, -2) / D**0.5
    if causal:
        s = s.masked_fill(torch.ones(T, T, dtype=torch.bool).triu(1), float("-inf"))
    return s.softmax(-1) @ v


@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("train", [False, True])
def test_fused_sdpa_counts_as_the_explicit_matmuls(causal, train):
    torch.manual_seed(0)
    q, k, v = (torch.randn(B, H, T, D, requires_grad=train) for _ in range(3))
    counts = []
    for fn in (lambda: F.scaled_dot_product_attention(q, k, v, is_causal=causal), lambda: _reference(q, k, v, causal)):
        with torch.set_grad_enabled(train), FlopCounter() as fc:
            out = fn()
            if train:
                out.sum().backward()
        counts.append(fc.get_total_flops())
    forward = 2 * 2 * B * H * T * T * D  # QK^T and AV
    # Training: the backward's four products (2x forward) for both; the fused backward also recomputes
    # QK^T block by block (half a forward), as torch's formula and the ledger's "recompute" row say.
    assert counts[1] == forward * (3 if train else 1)
    assert counts[0] == counts[1] + (forward // 2 if train else 0)


def test_the_counter_sees_every_attention_op_the_cpu_runs():
    """Whatever kernel this torch picks for SDPA on the CPU, FlopCounter has a formula for it."""
    seen = []

    class Ops(torch.utils._python_dispatch.TorchDispatchMode):
        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            seen.append(func._overloadpacket)
            return func(*args, **(kwargs or {}))

    q = torch.randn(B, H, T, D)
    with Ops():
        F.scaled_dot_product_attention(q, q, q, is_causal=True)
    attention = [op for op in seen if "scaled_dot_product" in str(op)]
    assert all(op in FORMULAS for op in attention), attention


def test_an_sdpa_model_equals_the_ledger():
    config = ModelConfig(arch="decoder", vocab_size=50, d_model=24, n_heads=3, n_layers=2, d_ff=40, max_positions=16,
                         attn_impl="sdpa")
    model = build(config).eval()
    ids = torch.randint(0, 50, (2, 9))
    flops = count_flops(model, ids)
    assert flops == ledger(config, Workload(phase="forward", batch=2, seq=9)).flops["matmul"]


def test_lstm_counts_its_gate_matmuls_with_onednn_available():
    lstm = torch.nn.LSTM(5, 6, batch_first=True)
    x = torch.randn(2, 4, 5)
    flops = count_flops(lstm, x)
    assert flops == 2 * 2 * 4 * (5 * 4 * 6 + 6 * 4 * 6)  # batch x steps x (input and hidden gate matmuls)
    assert torch.backends.mkldnn.enabled  # the counter's change of path does not outlive it


def test_plain_flop_counter_mode_is_what_the_counter_extends():
    """FlopCounter adds formulas only where torch has none: on ops torch covers, the counts are torch's."""
    a, b = torch.randn(4, 5), torch.randn(5, 6)
    with FlopCounterMode(display=False) as plain:
        a @ b
    with FlopCounter() as ours:
        a @ b
    assert ours.get_total_flops() == plain.get_total_flops() == 2 * 4 * 5 * 6
