"""Recurrent layers: the Elman RNN, the LSTM and the GRU, written out as the textbook's equations
(the teaching path) beside torch's fused kernels (the fast path, cuDNN on a GPU). Both paths read
the same parameters, named and shaped as torch names them, so weights copy 1:1:

    weight_ih_l{k}[_reverse]  (G*h, d_in)   G = 1 (RNN), 4 (LSTM: gates i, f, g, o), 3 (GRU: r, z, n)
    weight_hh_l{k}[_reverse]  (G*h, h)
    bias_ih_l{k}[_reverse], bias_hh_l{k}[_reverse]  (G*h,)   two bias vectors, as cuDNN keeps them

Tensors are batch-first: x (B, T, d_in) -> outputs (B, T, D*h), D = 2 when bidirectional. The state
is torch's: h (L*D, B, h), and for the LSTM the pair (h, c); row ``layer * D + direction``.
"""

from __future__ import annotations

from collections.abc import Callable

import torch
import torch.nn.functional as F
from torch import nn

from tformer.core.errors import TformerError

State = torch.Tensor | tuple[torch.Tensor, torch.Tensor]


# The cells: one time step, x (B, d_in), state (B, h) -------------------------------------------
def rnn_cell(x, h, w_ih, w_hh, b_ih, b_hh):
    """Elman: h' = tanh(W_ih x + b_ih + W_hh h + b_hh)."""
    return torch.tanh(F.linear(x, w_ih, b_ih) + F.linear(h, w_hh, b_hh))


def lstm_cell(x, state, w_ih, w_hh, b_ih, b_hh):
    """Hochreiter & Schmidhuber 1997 with a forget gate (Gers et al. 2000):

        i = sigmoid(W_ii x + W_hi h + b_i)    input gate: how much of the candidate to write
        f = sigmoid(W_if x + W_hf h + b_f)    forget gate: how much of the old cell to keep
        g = tanh(W_ig x + W_hg h + b_g)       candidate cell content
        o = sigmoid(W_io x + W_ho h + b_o)    output gate: how much of the cell to show
        c' = f * c + i * g                    the cell: an additive path the gradient flows along
        h' = o * tanh(c')
    """
    h, c = state
    gates = F.linear(x, w_ih, b_ih) + F.linear(h, w_hh, b_hh)
    i, f, g, o = gates.chunk(4, dim=-1)  # torch's row order of the stacked gate weights
    i, f, g, o = torch.sigmoid(i), torch.sigmoid(f), torch.tanh(g), torch.sigmoid(o)
    c = f * c + i * g
    return o * torch.tanh(c), c


def gru_cell(x, h, w_ih, w_hh, b_ih, b_hh):
    """Cho et al. 2014, as torch computes it (the reset gate scales W_hn h + b_hn):

        r = sigmoid(W_ir x + b_ir + W_hr h + b_hr)      reset gate
        z = sigmoid(W_iz x + b_iz + W_hz h + b_hz)      update gate: how much of the old state to keep
        n = tanh(W_in x + b_in + r * (W_hn h + b_hn))   candidate state
        h' = (1 - z) * n + z * h
    """
    xr, xz, xn = F.linear(x, w_ih, b_ih).chunk(3, dim=-1)
    hr, hz, hn = F.linear(h, w_hh, b_hh).chunk(3, dim=-1)
    r, z = torch.sigmoid(xr + hr), torch.sigmoid(xz + hz)
    n = torch.tanh(xn + r * hn)
    return (1 - z) * n + z * h


# name -> (the cell, gates per hidden unit, the torch module holding the same parameters)
CELLS: dict[str, tuple[Callable, int, type[nn.RNNBase]]] = {
    "rnn": (rnn_cell, 1, nn.RNN),
    "lstm": (lstm_cell, 4, nn.LSTM),
    "gru": (gru_cell, 3, nn.GRU),
}


def run_layer(cell: Callable, x: torch.Tensor, state: State, weights: tuple, reverse: bool = False,
              mask: torch.Tensor | None = None):
    """One layer in one direction, looping over time: x (B, T, d_in) -> outputs (B, T, h), final state.
    ``reverse`` reads t = T-1 ... 0 (the backward half of a bidirectional layer); outputs stay in time order.
    ``mask`` (B, T) bool: a padding step keeps the row's state and outputs zeros (as torch's packed sequences)."""
    steps = range(x.shape[1] - 1, -1, -1) if reverse else range(x.shape[1])
    outputs = [None] * x.shape[1]
    for t in steps:
        new = cell(x[:, t], state, *weights)
        if mask is not None:
            keep = mask[:, t, None]
            new = tuple(torch.where(keep, n, o) for n, o in zip(new, state)) if isinstance(new, tuple) \
                else torch.where(keep, new, state)
        state = new
        out = state[0] if isinstance(state, tuple) else state
        outputs[t] = out if mask is None else out * mask[:, t, None]
    if not outputs:
        return x.new_zeros(x.shape[0], 0, weights[1].shape[1]), state
    return torch.stack(outputs, dim=1), state


class _Teaching:
    """Adds the written-out path to a torch recurrent module: ``teaching = True`` runs the cells above
    over the module's own parameters; False runs torch's kernel. Same inputs, outputs and state."""

    teaching: bool = False

    def forward(self, x: torch.Tensor, state: State | None = None):
        if not self.batch_first:
            raise TformerError("tformer's recurrent layers are batch-first; build them with recurrent(...)")
        if not self.teaching:
            return super().forward(x, state)
        return self.loop(x, state)

    def weights(self, layer: int, direction: int) -> tuple:
        suffix = f"_l{layer}" + ("_reverse" if direction else "")
        names = ("weight_ih", "weight_hh", "bias_ih", "bias_hh")
        return tuple(getattr(self, n + suffix) if self.bias or n.startswith("weight") else None for n in names)

    def loop(self, x: torch.Tensor, state: State | None = None, mask: torch.Tensor | None = None):
        """The written-out layers; ``mask`` (B, T) bool: padding steps leave each row's state as it was."""
        cell = CELLS[self.cell][0]
        lstm = self.cell == "lstm"
        D, h = 2 if self.bidirectional else 1, self.hidden_size
        if state is None:
            zeros = x.new_zeros(self.num_layers * D, x.shape[0], h)
            state = (zeros, zeros) if lstm else zeros
        finals = []
        for layer in range(self.num_layers):
            outs = []
            for direction in range(D):
                row = layer * D + direction
                s0 = (state[0][row], state[1][row]) if lstm else state[row]
                out, s = run_layer(cell, x, s0, self.weights(layer, direction), reverse=bool(direction), mask=mask)
                outs.append(out)
                finals.append(s)
            x = torch.cat(outs, dim=-1) if D > 1 else outs[0]
            if self.dropout and self.training and layer < self.num_layers - 1:  # as torch: between layers
                x = F.dropout(x, self.dropout, training=True)
        if lstm:
            return x, (torch.stack([s[0] for s in finals]), torch.stack([s[1] for s in finals]))
        return x, torch.stack(finals)


class ElmanRNN(_Teaching, nn.RNN):
    cell = "rnn"


class LSTM(_Teaching, nn.LSTM):
    cell = "lstm"


class GRU(_Teaching, nn.GRU):
    cell = "gru"


_MODULES = {"rnn": ElmanRNN, "lstm": LSTM, "gru": GRU}


def recurrent(cell: str, d_in: int, d_hidden: int, n_layers: int = 1, bidirectional: bool = False,
              bias: bool = True, dropout: float = 0.0, teaching: bool = False) -> nn.RNNBase:
    """A stacked (optionally bidirectional) recurrent layer of ``cell`` (rnn | lstm | gru), batch-first;
    ``teaching``: run the written-out cells instead of torch's kernel (same parameters either way)."""
    if cell not in _MODULES:
        raise TformerError(f"cell='{cell}' is unknown; choose one of: {', '.join(_MODULES)}")
    module = _MODULES[cell](d_in, d_hidden, num_layers=n_layers, bias=bias, batch_first=True,
                            dropout=dropout if n_layers > 1 else 0.0, bidirectional=bidirectional)
    module.teaching = teaching
    return module


def select_state(state: State, index: torch.Tensor) -> State:
    """Rows ``index`` of a state (beam search): the batch is dimension 1."""
    if isinstance(state, tuple):
        return tuple(s[:, index] for s in state)
    return state[:, index]


def where_state(keep: torch.Tensor, new: State, old: State) -> State:
    """Per row (keep: (B,) bool): the new state where True, the old one where False (padding)."""
    k = keep[None, :, None]
    if isinstance(new, tuple):
        return tuple(torch.where(k, n, o) for n, o in zip(new, old))
    return torch.where(k, new, old)


__all__ = ["CELLS", "ElmanRNN", "GRU", "LSTM", "gru_cell", "lstm_cell", "recurrent", "rnn_cell", "run_layer",
           "select_state", "where_state"]
