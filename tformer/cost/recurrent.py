"""What a recurrent layer costs (no torch): parameters, FLOPs per time step, the hidden state's bytes,
and the sequential steps a sequence needs. The ledger rows of arch='rnn' (tformer.cost.oplist) are
built from these; the textbook's formulas (section 6.2) are the special cases G = 4 (LSTM).

Per layer and direction, with input width d, hidden width h and G gate blocks (Elman 1, GRU 3, LSTM 4):

    params, exact (torch, cuDNN: two bias vectors b_ih and b_hh)   G((d + h)h + 2h)
    params, course convention (one bias per gate)                  G((d + h)h + h)
    matmul FLOPs per time step per sequence (2 per multiply-add)   2Gh(h + d): LSTM 8h(h+d), GRU 6h(h+d), RNN 2h(h+d)
    state kept between steps, per sequence                         h (LSTM: h and c, 2h) elements

A recurrent layer runs one step per token, each waiting for the last: n sequential steps for a
sequence of n tokens. An attention layer reads every position at once: 1 step.
"""

from __future__ import annotations

GATES = {"rnn": 1, "gru": 3, "lstm": 4}  # gate blocks stacked in weight_ih / weight_hh (torch's row order)
STATES = {"rnn": 1, "gru": 1, "lstm": 2}  # tensors carried between steps: h (and the LSTM's cell c)
# Element-wise FLOPs per hidden unit per step (a convention, like tformer.cost.ops; FlopCounterMode counts none):
#   rnn:  add the two projections (1), tanh (1)
#   lstm: add the projections (4), three sigmoids and tanh(g) (4), f*c + i*g (3), tanh(c) (1), o * tanh(c) (1)
#   gru:  add the r, z projections (2), two sigmoids (2), r * hn (1), + xn (1), tanh (1), (1-z)*n + z*h (4)
CELL_FLOPS_PER_UNIT = {"rnn": 2, "lstm": 13, "gru": 11}


def recurrent_params(cell: str, d_in: int, d_hidden: int, bias: bool = True, convention: str = "exact") -> int:
    """Parameters of one layer in one direction. ``convention``: exact (torch's two bias vectors) or
    course (the textbook's one bias vector per gate)."""
    g, h = GATES[cell], d_hidden
    biases = (2 if convention == "exact" else 1) * h if bias else 0
    return g * ((d_in + h) * h + biases)


def recurrent_step_flops(cell: str, d_in: int, d_hidden: int) -> int:
    """Matmul FLOPs of one time step of one sequence in one layer and direction: 2Gh(h + d)."""
    return 2 * GATES[cell] * d_hidden * (d_hidden + d_in)


def state_bytes(cell: str, d_hidden: int, batch: int = 1, layers: int = 1, directions: int = 1,
                bytes_per_element: int = 4) -> int:
    """Bytes of the state carried between steps (what generation keeps instead of a KV cache): it does
    not grow with the sequence."""
    return STATES[cell] * layers * directions * batch * d_hidden * bytes_per_element


def sequential_steps(recurrent: bool, seq: int) -> int:
    """Steps one layer takes over a sequence of ``seq`` tokens, each waiting for the one before:
    seq for a recurrent layer, 1 for an attention layer (all positions at once)."""
    return seq if recurrent else 1


def recurrent_summary(config, seq: int, batch: int, bytes_per_element: int) -> dict:
    """The recurrent figures of an arch='rnn' config for ``tformer count`` (per layer, one direction)."""
    c = config
    layers = [(c.d_model if i == 0 else c.d_hidden) for i in range(c.n_layers)]
    return {
        "cell": c.cell,
        "d_hidden": c.d_hidden,
        "params_exact": sum(recurrent_params(c.cell, d, c.d_hidden, c.bias) for d in layers),
        "params_course": sum(recurrent_params(c.cell, d, c.d_hidden, c.bias, "course") for d in layers),
        "step_matmul_flops": sum(recurrent_step_flops(c.cell, d, c.d_hidden) for d in layers),
        "state_bytes": state_bytes(c.cell, c.d_hidden, batch, c.n_layers, 1, bytes_per_element),
        "sequential_steps_per_layer": sequential_steps(True, seq),
        "sequential_steps_attention_layer": sequential_steps(False, seq),
        "note": "params_exact: torch's two bias vectors G((d+h)h + 2h); params_course: one per gate G((d+h)h + h); "
                "step FLOPs: 2Gh(h+d) per token per layer; the state does not grow with the sequence; "
                "each layer takes one step per token, an attention layer one step per sequence",
    }


__all__ = ["CELL_FLOPS_PER_UNIT", "GATES", "STATES", "recurrent_params", "recurrent_step_flops", "recurrent_summary",
           "sequential_steps", "state_bytes"]
