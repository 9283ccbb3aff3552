"""The decode-speed Linear: same numbers as F.linear, and it stays out of the way of autograd."""

import pytest
import torch
import torch.nn.functional as F

from tformer.model import linear
from tformer.model.linear import Linear, split_rows_linear


@pytest.mark.parametrize("out_features", [512, 515, 1031])
@pytest.mark.parametrize("rows", [1, 3, 32])
@pytest.mark.parametrize("bias", [True, False])
def test_split_product_equals_f_linear(out_features, rows, bias):
    g = torch.Generator().manual_seed(out_features + rows)
    x = torch.randn(rows, 96, generator=g)
    w = torch.randn(out_features, 96, generator=g)
    b = torch.randn(out_features, generator=g) if bias else None
    for parts in (2, 3, 4):
        got = split_rows_linear(x, w, b, parts)
        assert got.shape == (rows, out_features)
        torch.testing.assert_close(got, F.linear(x, w, b), rtol=1e-5, atol=1e-5)


def test_leading_dimensions_are_kept():
    x = torch.randn(2, 1, 3, 64)
    w, b = torch.randn(300, 64), torch.randn(300)
    got = split_rows_linear(x, w, b, 2)
    assert got.shape == (2, 1, 3, 300)
    torch.testing.assert_close(got, F.linear(x, w, b), rtol=1e-5, atol=1e-5)


def _spy(monkeypatch):
    calls = []
    real = linear.split_rows_linear
    monkeypatch.setattr(linear, "split_rows_linear", lambda *a: calls.append(a[3]) or real(*a))
    return calls


def test_layer_takes_split_path_for_few_rows_without_grad(monkeypatch):
    calls = _spy(monkeypatch)
    monkeypatch.setattr(torch, "get_num_threads", lambda: 2)
    layer = Linear(256, 1024)
    x = torch.randn(1, 4, 256)
    with torch.no_grad():
        got = layer(x)
    assert calls == [2]
    torch.testing.assert_close(got, F.linear(x, layer.weight, layer.bias), rtol=1e-5, atol=1e-5)


def test_layer_keeps_plain_path_for_training_many_rows_or_when_disabled(monkeypatch):
    calls = _spy(monkeypatch)
    monkeypatch.setattr(torch, "get_num_threads", lambda: 2)
    layer = Linear(256, 1024)
    y = layer(torch.randn(1, 4, 256))  # autograd on: the backward must be PyTorch's own
    y.sum().backward()
    assert layer.weight.grad is not None
    with torch.no_grad():
        layer(torch.randn(1, linear.MAX_ROWS + 1, 256))  # prefill-sized: the BLAS GEMM wins
        Linear(256, 1024).double()(torch.randn(1, 4, 256).double())  # not fp32
        Linear(1024, 200)(torch.randn(1, 4, 1024))  # too few output rows to cut
        Linear(256, 256)(torch.randn(1, 4, 256))  # small enough to sit in cache
        Linear(2048, 512)(torch.randn(1, 4, 2048))  # long rows: the BLAS streams them already
        monkeypatch.setattr(linear, "enabled", False)
        layer(torch.randn(1, 4, 256))
    assert calls == []


def test_state_dict_keys_are_nn_linear_s():
    assert list(Linear(4, 3).state_dict()) == list(torch.nn.Linear(4, 3).state_dict())
