"""The written-out cells equal torch.nn.RNN / LSTM / GRU with copied weights."""

import pytest
import torch

from tformer.core.errors import TformerError
from tformer.model.rnn import CELLS, gru_cell, lstm_cell, recurrent, rnn_cell

TOL = 1e-6


def _pair(cell, d_in, h, layers, bidirectional, bias=True):
    """A torch module with random weights and our module holding a copy; float64."""
    torch.manual_seed(0)
    ref = CELLS[cell][2](d_in, h, num_layers=layers, bias=bias, batch_first=True,
                         bidirectional=bidirectional).double()
    ours = recurrent(cell, d_in, h, layers, bidirectional, bias=bias, teaching=True).double()
    assert [(n, p.shape) for n, p in ours.named_parameters()] == [(n, p.shape) for n, p in ref.named_parameters()]
    ours.load_state_dict(ref.state_dict())  # the same names: weights copy 1:1
    return ref, ours


def _close(a, b):
    if isinstance(a, tuple):
        for x, y in zip(a, b):
            _close(x, y)
        return
    assert a.shape == b.shape
    assert (a - b).abs().max().item() < TOL


@pytest.mark.parametrize("cell", ["rnn", "lstm", "gru"])
@pytest.mark.parametrize("layers,bidirectional", [(1, False), (3, False), (1, True), (3, True)])
def test_teaching_path_equals_torch(cell, layers, bidirectional):
    d_in, h, B, T = 7, 5, 3, 11  # odd sizes
    ref, ours = _pair(cell, d_in, h, layers, bidirectional)
    x = torch.randn(B, T, d_in, dtype=torch.float64)
    D = 2 if bidirectional else 1
    h0 = torch.randn(layers * D, B, h, dtype=torch.float64)
    state = (h0, torch.randn_like(h0)) if cell == "lstm" else h0
    for s in (None, state):
        x1, x2 = x.clone().requires_grad_(), x.clone().requires_grad_()
        out_ref, fin_ref = ref(x1, s)
        out, fin = ours(x2, s)
        assert out.shape == (B, T, D * h)
        _close(out, out_ref)
        _close(fin, fin_ref)
        # Gradients: of the input and of every parameter, through outputs and final states.
        w = torch.randn_like(out)
        ((out * w).sum() + sum(t.sum() for t in (fin if isinstance(fin, tuple) else (fin,)))).backward()
        ((out_ref * w).sum() + sum(t.sum() for t in (fin_ref if isinstance(fin_ref, tuple) else (fin_ref,)))).backward()
        _close(x2.grad, x1.grad)
        for (name, p), q in zip(ours.named_parameters(), ref.parameters()):
            _close(p.grad, q.grad)
        ours.zero_grad(), ref.zero_grad()


@pytest.mark.parametrize("cell", ["rnn", "lstm", "gru"])
def test_fast_path_is_torch_on_the_same_parameters(cell):
    _, ours = _pair(cell, 4, 6, 2, True)
    x = torch.randn(2, 5, 4, dtype=torch.float64)
    slow, slow_state = ours(x)
    ours.teaching = False
    fast, fast_state = ours(x)
    _close(slow, fast)
    _close(slow_state, fast_state)


@pytest.mark.parametrize("cell", ["rnn", "lstm", "gru"])
def test_without_bias(cell):
    ref, ours = _pair(cell, 3, 4, 2, False, bias=False)
    x = torch.randn(2, 6, 3, dtype=torch.float64)
    _close(ours(x), ref(x))


def test_cells_follow_the_textbook_equations_on_one_step():
    torch.manual_seed(1)
    d, h = 3, 2
    x, h0, c0 = torch.randn(1, d), torch.randn(1, h), torch.randn(1, h)
    w_ih, w_hh, b_ih, b_hh = torch.randn(4 * h, d), torch.randn(4 * h, h), torch.randn(4 * h), torch.randn(4 * h)
    z = x @ w_ih.T + b_ih + h0 @ w_hh.T + b_hh
    i, f, g, o = z[:, :h].sigmoid(), z[:, h:2 * h].sigmoid(), z[:, 2 * h:3 * h].tanh(), z[:, 3 * h:].sigmoid()
    c1 = f * c0 + i * g
    h1, c = lstm_cell(x, (h0, c0), w_ih, w_hh, b_ih, b_hh)
    assert torch.allclose(c, c1, atol=1e-6) and torch.allclose(h1, o * c1.tanh(), atol=1e-6)
    e = rnn_cell(x, h0, w_ih[:h], w_hh[:h], b_ih[:h], b_hh[:h])
    assert torch.allclose(e, (x @ w_ih[:h].T + b_ih[:h] + h0 @ w_hh[:h].T + b_hh[:h]).tanh(), atol=1e-6)
    r = gru_cell(x, h0, w_ih[:3 * h], w_hh[:3 * h], b_ih[:3 * h], b_hh[:3 * h])
    ref = torch.nn.GRUCell(d, h)
    with torch.no_grad():
        ref.weight_ih.copy_(w_ih[:3 * h]), ref.weight_hh.copy_(w_hh[:3 * h])
        ref.bias_ih.copy_(b_ih[:3 * h]), ref.bias_hh.copy_(b_hh[:3 * h])
    assert torch.allclose(r, ref(x, h0), atol=1e-6)


def test_unknown_cell_is_one_line():
    with pytest.raises(TformerError, match="cell='lstn' is unknown; choose one of: rnn, lstm, gru"):
        recurrent("lstn", 2, 2)
