"""A recurrent encoder-decoder with attention (arch='rnn-seq2seq'): what the Transformer's cross-attention grew
out of. The token table serves source and target (as in tformer's Transformer encoder-decoder).

    source -> embeddings (d) -> encoder RNN (n_layers, h; bidirectional: 2h, bridged to h) -> h_1 .. h_S
    target -> embeddings (d) -> decoder RNN (n_layers, h), started from the encoder's final state,
              attending to h_1 .. h_S at every step -> LM head -> logits

Bahdanau et al. 2015 (additive), one step, s_{t-1} the decoder's top state before reading y_{t-1}:
    e_tj = v^T tanh(W_s s_{t-1} + W_h h_j)      (B, S)        a_t = softmax_j(e_t)   (padding: weight 0)
    c_t = sum_j a_tj h_j                          (B, h)
    s_t = RNN([E y_{t-1}; c_t], s_{t-1})          decoder input (B, d + h)
    logits = W_o [s_t; c_t]                       (B, V): one Linear over the state and the context (this module's
                                                  output layer; the paper's adds a maxout layer before it)
Luong et al. 2015 (global attention), h_t the decoder's top state after reading the input:
    h_t = RNN([E y_{t-1}; h~_{t-1}], ...)         input feeding: the last attentional vector is fed back
    e_ts = h_t . h_s (dot) or h_t . W_a h_s (general)     a_t = softmax_s(e_t)    c_t = sum_s a_ts h_s
    h~_t = tanh(W_c [c_t; h_t])                   (B, h)      logits = W_o h~_t   (B, V)

Input feeding is on by default, as in the paper: without it each step's attention decision is made without
knowing what was attended before (the decoder never sees c_{t-1}), which is what the paper's coverage
argument adds back. Off, the decoder RNN does not depend on attention, so training runs it over the whole
target at once and attends for all steps in one batched product.

Shapes: memory (B, S, h), keys (B, S, h), source mask (B, S) bool, state as torch's: (n_layers, B, h) (and c).
A padded source batch is compacted first, each row's real tokens to the front (the attention sum does not
depend on where in the row a key sits), so both encoder paths see right-padding: torch's packed sequences
on the fast path, the written-out cells with a mask on the teaching path; weights are returned in the
source's own positions.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import nn
from torch.nn.utils.rnn import pack_padded_sequence, pad_packed_sequence

from tformer.core.errors import TformerError
from tformer.cost.architecture import Bridge, RecurrentAttention, describe, rnn_seq2seq_widths
from tformer.model.base import ModelOutput, TransformerModel, lm_loss
from tformer.model.encoder_decoder import EncoderDecoderModel
from tformer.model.linear import Linear
from tformer.model.rnn import recurrent, select_state


@dataclass
class Memory:
    """The encoded source, kept for every decoder step."""

    outputs: torch.Tensor  # (B, S, h) h_1 .. h_S (compacted: each row's real tokens first)
    mask: torch.Tensor | None  # (B, S) bool, True = real token; None when no row is padded
    keys: torch.Tensor | None  # (B, S, h) W_h h_j (Bahdanau), W_a h_s (general), h_s (dot); None: no attention
    state: object  # the encoder's final state, bridged: (n_layers, B, h), and c for an LSTM
    order: torch.Tensor | None = None  # (B, S) source position of each compacted column (padded batches)

    def select(self, index: torch.Tensor) -> Memory:
        def pick(t):
            return None if t is None else t[index]
        outputs = self.outputs[index]
        keys = outputs if self.keys is self.outputs else pick(self.keys)  # luong-dot: the keys are the outputs
        return Memory(outputs, pick(self.mask), keys, select_state(self.state, index), pick(self.order))


@dataclass
class DecoderState:
    """What a decoder step carries to the next: the RNN state and Luong's input-feed vector h~_{t-1}."""

    rnn: object  # (n_layers, B, h), and c for an LSTM
    feed: torch.Tensor | None = None  # (B, h); None without input feeding


class RecurrentSeq2Seq(TransformerModel):
    def __init__(self, config):
        super().__init__(config)
        c, arch = config, describe(config)
        rnn = {"bias": c.bias, "dropout": c.dropout, "teaching": c.rnn_teaching}
        self.encoder = recurrent(c.cell, c.d_model, c.d_hidden, c.n_layers, bidirectional=c.bidirectional, **rnn)
        bridge = next((b for b in arch.stack("encoder").layers if isinstance(b, Bridge)), None)
        self.bridge = None if bridge is None else nn.ModuleDict(
            {spec.path.split(".")[-1]: Linear.described(spec) for spec in (bridge.memory, bridge.state) if spec})
        d_in, _ = rnn_seq2seq_widths(c)
        self.decoder = recurrent(c.cell, d_in, c.d_hidden, c.n_layers, **rnn)
        att = next((a for a in arch.stack("decoder").layers if isinstance(a, RecurrentAttention)), None)
        self.attention = None if att is None else nn.ModuleDict(
            {spec.path.split(".")[-1]: Linear.described(spec) for spec in (att.keys, att.query, att.score, att.combine)
             if spec is not None})
        self.kind = c.rnn_attention
        self.feeding = self.kind.startswith("luong") and bool(c.rnn_input_feeding)
        self.add_lm_head(arch)

    def shift_right(self, labels: torch.Tensor) -> torch.Tensor:
        return EncoderDecoderModel.shift_right(self, labels)  # reads only the config's start and pad ids

    # The encoder ------------------------------------------------------------------------------------
    def encode(self, input_ids: torch.Tensor, attention_mask: torch.Tensor | None = None) -> Memory:
        """(B, S) source ids (1 in ``attention_mask`` = real token, padding anywhere) -> Memory."""
        x, order = self.embed(input_ids), None
        mask = None if attention_mask is None or bool(attention_mask.all()) else attention_mask.bool()
        if mask is None:
            out, state = self.encoder(x)
        else:
            lengths = mask.sum(1)
            if bool((lengths == 0).any()):
                raise TformerError("a source row has no real token (its attention mask is all 0); give each row one")
            order = torch.argsort((~mask).to(torch.int8), dim=1, stable=True)  # real tokens first, in order
            x = x.gather(1, order[..., None].expand_as(x))
            mask = torch.arange(x.shape[1], device=x.device)[None] < lengths[:, None]
            if self.encoder.teaching:
                out, state = self.encoder.loop(x, None, mask)
            else:
                packed = pack_padded_sequence(x, lengths.cpu(), batch_first=True, enforce_sorted=False)
                out, state = self.encoder(packed)
                out, _ = pad_packed_sequence(out, batch_first=True, total_length=x.shape[1])
        if self.bridge is not None:
            out = self.bridge["memory"](out) if "memory" in self.bridge else out  # no attention: never read
            state = tuple(map(self._bridge_state, state)) if isinstance(state, tuple) else self._bridge_state(state)
        return Memory(out, mask, self._keys(out), state, order)

    def _bridge_state(self, s: torch.Tensor) -> torch.Tensor:
        # torch's rows are layer * 2 + direction: (L * 2, B, h) -> (L, B, 2h) [forward; backward] -> (L, B, h)
        L2, B, h = s.shape
        return self.bridge["state"](s.view(L2 // 2, 2, B, h).permute(0, 2, 1, 3).reshape(L2 // 2, B, 2 * h))

    def _keys(self, memory: torch.Tensor) -> torch.Tensor | None:
        # The source-side term of the score does not change with the decoder step, so it is projected once
        # per source (S products of h x h) instead of once per step (T x S of them).
        if self.kind in ("bahdanau", "luong-general"):
            return self.attention["key_proj"](memory)
        return memory if self.kind == "luong-dot" else None

    def start(self, memory: Memory) -> DecoderState:
        """The decoder's state before the first target token: the encoder's final state (and h~_0 = 0)."""
        s = memory.state
        feed = s[0][-1].new_zeros(s[0].shape[1:]) if isinstance(s, tuple) else s.new_zeros(s.shape[1:])
        return DecoderState(s, feed if self.feeding else None)

    # Attention --------------------------------------------------------------------------------------
    def attend(self, query: torch.Tensor, memory: Memory) -> tuple[torch.Tensor, torch.Tensor]:
        """query (B, T, h): Bahdanau's s_{t-1} or Luong's h_t -> (context (B, T, h), weights (B, T, S))."""
        if self.kind == "bahdanau":
            # e_tj = v^T tanh(W_s s + W_h h_j): (B, T, 1, h) + (B, 1, S, h) -> (B, T, S)
            q = self.attention["query_proj"](query)
            scores = self.attention["score"](torch.tanh(q[:, :, None] + memory.keys[:, None])).squeeze(-1)
        else:
            scores = torch.bmm(query, memory.keys.transpose(1, 2))  # h_t . h_s, or h_t . W_a h_s
        if memory.mask is not None:
            scores = scores.masked_fill(~memory.mask[:, None], float("-inf"))
        weights = torch.softmax(scores, dim=-1)
        return torch.bmm(weights, memory.outputs), weights

    # The decoder ------------------------------------------------------------------------------------
    def decode(self, decoder_input_ids: torch.Tensor, memory: Memory, state: DecoderState,
               output_attentions: bool = False, logits_to_keep: int = 0):
        """(B, T) target ids from ``state`` -> (logits (B, T, V), the state after them, weights (B, T, S) in
        the source's own positions or None)."""
        emb = self.embed(decoder_input_ids)
        if self.kind == "none" or (self.kind.startswith("luong") and not self.feeding):
            out, rnn = self.decoder(emb, state.rnn)  # the RNN reads no attention: all steps in one call
            state = DecoderState(rnn)
            weights = None
            if self.kind != "none":
                context, weights = self.attend(out, memory)
                out = torch.tanh(self.attention["combine"](torch.cat([context, out], dim=-1)))
        else:
            outs, steps = [], []
            for t in range(emb.shape[1]):
                out, state, w = self._step(emb[:, t:t + 1], memory, state)
                outs.append(out)
                steps.append(w)
            out, weights = torch.cat(outs, dim=1), torch.cat(steps, dim=1)
        if logits_to_keep:
            out = out[:, -logits_to_keep:]
        weights = self._in_source_order(weights, memory) if output_attentions and weights is not None else None
        return self.lm_head(out), state, weights

    def _step(self, emb: torch.Tensor, memory: Memory, state: DecoderState):
        """One target token, emb (B, 1, d) -> (the head's input (B, 1, width), next state, weights (B, 1, S))."""
        if self.kind == "bahdanau":
            s = state.rnn[0] if isinstance(state.rnn, tuple) else state.rnn
            context, weights = self.attend(s[-1][:, None], memory)  # s_{t-1}: the top layer, before this step
            out, rnn = self.decoder(torch.cat([emb, context], dim=-1), state.rnn)
            return torch.cat([out, context], dim=-1), DecoderState(rnn), weights
        out, rnn = self.decoder(torch.cat([emb, state.feed[:, None]], dim=-1), state.rnn)  # input feeding
        context, weights = self.attend(out, memory)
        tilde = torch.tanh(self.attention["combine"](torch.cat([context, out], dim=-1)))
        return tilde, DecoderState(rnn, tilde[:, 0]), weights

    def _in_source_order(self, weights: torch.Tensor, memory: Memory) -> torch.Tensor:
        if memory.order is None:
            return weights
        return torch.zeros_like(weights).scatter(2, memory.order[:, None].expand_as(weights), weights)

    def forward(
        self,
        input_ids: torch.Tensor | None = None,  # (B, S) source
        attention_mask: torch.Tensor | None = None,  # (B, S) 1 = real token
        decoder_input_ids: torch.Tensor | None = None,  # (B, T) target, shifted right
        decoder_attention_mask: torch.Tensor | None = None,  # unused: the decoder reads left to right, so
        # a target's right padding never reaches an earlier position (and its labels are -100)
        encoder_outputs: Memory | None = None,  # reuse a source already encoded
        past_key_values: DecoderState | None = None,  # the decoder's state after the tokens read before
        use_cache: bool = False,
        labels: torch.Tensor | None = None,  # (B, T), not shifted; -100 = ignore
        output_attentions: bool = False,
        logits_to_keep: int = 0,
    ) -> ModelOutput:
        memory = encoder_outputs if encoder_outputs is not None else self.encode(input_ids, attention_mask)
        if decoder_input_ids is None:
            if labels is None:
                raise TformerError("an encoder-decoder model needs decoder_input_ids (or labels to shift right)")
            decoder_input_ids = self.shift_right(labels)
        state = past_key_values if past_key_values is not None else self.start(memory)
        logits, state, weights = self.decode(decoder_input_ids, memory, state, output_attentions, logits_to_keep)
        return ModelOutput(
            logits=logits, last_hidden_state=None,
            loss=lm_loss(logits, labels, shift=False) if labels is not None else None,
            encoder_last_hidden_state=memory.outputs, past_key_values=state,
            cross_attentions=[weights] if output_attentions and weights is not None else None,
        )


__all__ = ["DecoderState", "Memory", "RecurrentSeq2Seq"]
