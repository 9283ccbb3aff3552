"""What a recurrent encoder-decoder's attention costs (arch='rnn-seq2seq', tformer.model.rnn_seq2seq), no torch.

Per sequence, decoder width h, n source positions (matmul FLOPs, 2 per multiply-add):

    kind            parameters      once per source (keys)    per decoder step
    bahdanau        2h^2 + h        2nh^2 (W_h h_j)           2h^2 (W_s s) + 2nh (v^T tanh) + 2nh (context)
    luong-dot       2h^2            0                         2nh (h_t . h_s) + 2nh (context) + 4h^2 (W_c)
    luong-general   3h^2            2nh^2 (W_a h_s)           2nh + 2nh + 4h^2
    none            0               0                         0

The per-step cost grows with the source (n per step, n x m over a target of m): the price of letting every
step look at every source position, which a plain encoder-decoder RNN (one fixed vector) does not pay.
The keys' source-side projection is paid once per source, not once per step, because it does not depend
on the decoder's state.
"""

from __future__ import annotations

from tformer.cost.architecture import rnn_seq2seq_widths
from tformer.cost.recurrent import recurrent_params, recurrent_step_flops, sequential_steps, state_bytes


def attention_params(kind: str, h: int) -> int:
    """Parameters of the attention (none has biases, as in the papers)."""
    return {"bahdanau": 2 * h * h + h, "luong-dot": 2 * h * h, "luong-general": 3 * h * h, "none": 0}[kind]


def attention_keys_flops(kind: str, h: int, n_src: int) -> int:
    """Matmul FLOPs of the keys' projection, once per source sequence."""
    return 2 * n_src * h * h if kind in ("bahdanau", "luong-general") else 0


def attention_step_flops(kind: str, h: int, n_src: int) -> int:
    """Matmul FLOPs of one decoder step's attention for one sequence over ``n_src`` source positions."""
    if kind == "none":
        return 0
    read = 4 * n_src * h  # the scores (v^T tanh(.) or h_t . k_s) and the context sum_s a_s h_s
    return read + (2 * h * h if kind == "bahdanau" else 4 * h * h)


def rnn_seq2seq_summary(config, seq: int, seq_decoder: int, batch: int, bytes_per_element: int) -> dict:
    """The recurrent figures of an arch='rnn-seq2seq' config for ``tformer count``: ``seq`` source and
    ``seq_decoder`` target tokens (1 in a decode step)."""
    c, h, L = config, config.d_hidden, config.n_layers
    D = 2 if c.bidirectional else 1
    d_dec, _ = rnn_seq2seq_widths(c)
    enc = [(c.d_model if i == 0 else D * h) for i in range(L)]
    dec = [(d_dec if i == 0 else h) for i in range(L)]
    kind = c.rnn_attention

    def params(convention):
        return (D * sum(recurrent_params(c.cell, d, h, c.bias, convention) for d in enc)
                + sum(recurrent_params(c.cell, d, h, c.bias, convention) for d in dec))

    feed = h if kind.startswith("luong") and c.rnn_input_feeding else 0
    memory = seq * h * (0 if kind == "none" else 1 if kind == "luong-dot" else 2)
    return {
        "cell": c.cell,
        "d_hidden": h,
        "attention": kind,
        "bidirectional": c.bidirectional,
        "params_exact": params("exact"),
        "params_course": params("course"),
        "attention_params": attention_params(kind, h),
        "step_matmul_flops": sum(recurrent_step_flops(c.cell, d, h) for d in dec) + attention_step_flops(kind, h, seq),
        "attention_step_flops": attention_step_flops(kind, h, seq),
        "attention_keys_flops": attention_keys_flops(kind, h, seq),
        "state_bytes": state_bytes(c.cell, h, batch, L, 1, bytes_per_element),
        "cache_bytes": state_bytes(c.cell, h, batch, L, 1, bytes_per_element)
        + batch * (memory + feed) * bytes_per_element,
        "sequential_steps_per_layer": sequential_steps(True, seq_decoder),
        "encoder_sequential_steps_per_layer": sequential_steps(True, seq),
        "sequential_steps_attention_layer": sequential_steps(False, seq_decoder),
        "note": "params: the recurrent layers (encoder x directions, decoder) in torch's (exact) and the course's "
                "convention; step FLOPs: one decoder token, its RNN layers plus attention over the source "
                "(2h^2 + 4nh Bahdanau, 4h^2 + 4nh Luong); keys: once per source; the cache keeps the decoder's "
                "state, the encoder's outputs and keys (the source's size) and Luong's input feed",
    }


__all__ = ["attention_keys_flops", "attention_params", "attention_step_flops", "rnn_seq2seq_summary"]
