"""A recurrent language model (arch='rnn'): the baseline the Transformer replaced.

    tokens -> embeddings (d_model) -> n_layers LSTM / GRU / Elman layers (d_hidden) -> LM head -> logits

The recurrent layers are one torch module (``self.rnn``: torch's kernel, cuDNN on a GPU; with
``rnn_teaching`` the written-out cells of tformer.model.rnn over the same parameters). Its state is
what generation keeps between steps (the RNN's "cache"): h (n_layers, B, d_hidden), and c for an LSTM.
"""

from __future__ import annotations

import torch

from tformer.cost.architecture import describe
from tformer.model.base import ModelOutput, TransformerModel, lm_loss
from tformer.model.rnn import recurrent, where_state


class RecurrentLM(TransformerModel):
    def __init__(self, config):
        super().__init__(config)
        arch = describe(config)
        c = config
        self.rnn = recurrent(c.cell, c.d_model, c.d_hidden, c.n_layers, bias=c.bias, dropout=c.dropout,
                             teaching=c.rnn_teaching)
        self.add_lm_head(arch)

    def lm_logits(self, h: torch.Tensor) -> torch.Tensor:
        return self.lm_head(h)

    def forward(
        self,
        input_ids: torch.Tensor,  # (B, T)
        attention_mask: torch.Tensor | None = None,  # (B, T) 1 = real token; padding leaves the state as it was
        past_key_values=None,  # the state after the tokens read before (None: zeros)
        use_cache: bool = False,
        labels: torch.Tensor | None = None,  # (B, T); shifted inside, -100 = ignore
        logits_to_keep: int = 0,  # > 0: logits for the last n positions only
        **unused,  # position_ids and the like: an RNN counts positions by reading in order
    ) -> ModelOutput:
        x = self.embed(input_ids)
        state = past_key_values
        if attention_mask is None or bool(attention_mask.all()):
            h, state = self.rnn(x, state)
        else:
            h, state = self._masked(x, attention_mask.bool(), state)
        logits = self.lm_logits(h[:, -logits_to_keep:] if logits_to_keep else h)
        return ModelOutput(
            logits=logits, last_hidden_state=h,
            loss=lm_loss(logits, labels, shift=True) if labels is not None else None,
            past_key_values=state,
        )

    def _masked(self, x: torch.Tensor, mask: torch.Tensor, state):
        """One step at a time, keeping each row's state where its token is padding: a left-padded
        row then starts from the state it would have had with no padding in front."""
        outputs = []
        for t in range(x.shape[1]):
            out, new = self.rnn(x[:, t:t + 1], state)
            if state is None:
                zeros = torch.zeros_like(new[0] if isinstance(new, tuple) else new)
                state = (zeros, zeros.clone()) if isinstance(new, tuple) else zeros
            state = where_state(mask[:, t], new, state)
            outputs.append(out)
        return torch.cat(outputs, dim=1), state
