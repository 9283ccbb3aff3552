"""Encoder-decoder Transformer: the 2017 paper (Vaswani et al.), and by configuration BART and T5.

    source -> embeddings -> N bidirectional blocks -------------------> memory
    target -> embeddings -> M causal blocks, each also attending to memory -> LM head -> logits

One token embedding table serves the encoder, the decoder and (tied) the output layer.
"""

from __future__ import annotations

import torch

from tformer.core.errors import TformerError
from tformer.cost.architecture import describe
from tformer.model.base import ModelOutput, TransformerModel, lm_loss
from tformer.model.blocks import Stack
from tformer.model.cache import KVCache


class EncoderDecoderModel(TransformerModel):
    def __init__(self, config):
        arch = describe(config)
        super().__init__(config, table=arch.tok_embed)
        self.encoder = Stack(config, arch.stack("encoder"))
        self.decoder = Stack(config, arch.stack("decoder"))
        self.add_lm_head(arch)
        if config.final_logits_bias:  # BART keeps a (normally zero) bias buffer on the logits
            self.register_buffer("final_logits_bias", torch.zeros(1, config.vocab_size))
        else:
            self.final_logits_bias = None

    def new_cache(self, reserve: int | None = None) -> KVCache:
        """A KV cache of one layout per layer (a sliding-window layer's rolling window caps its memory, whatever
        the length); ``reserve``: positions the growing layers allocate up front and then write in place."""
        return KVCache.for_config(self.config, self.config.n_decoder_layers, reserve or 0)

    def encode(self, input_ids, attention_mask=None, output_attentions=False):
        """(B, S) source ids -> (memory (B, S, d_model), per-layer attention weights)."""
        h, weights, _ = self.encoder(self.embed(input_ids), attention_mask, need_weights=output_attentions)
        return h, weights

    def decode(self, decoder_input_ids, memory, memory_mask=None, decoder_attention_mask=None,
               cache=None, position_ids=None, output_attentions=False, logits_to_keep=0):
        """(B, T) target ids attending to memory -> (logits (B, T, vocab), hidden, self and cross weights).

        logits_to_keep > 0: logits for the last n positions only (what generation needs).
        """
        h, self_w, cross_w = self.decoder(
            self.embed(decoder_input_ids), decoder_attention_mask, position_ids,
            memory=memory, memory_mask=memory_mask, cache=cache, need_weights=output_attentions,
        )
        return self.lm_logits(h[:, -logits_to_keep:] if logits_to_keep else h), h, self_w, cross_w

    def lm_logits(self, h: torch.Tensor) -> torch.Tensor:
        """The decoder's final hidden states (..., d_model) -> logits (..., vocab): T5 rescales before its
        tied head, BART adds its logits bias."""
        h = h * self.config.d_model**-0.5 if self.config.rescale_tied_head else h
        logits = self.lm_head(h)
        return logits + self.final_logits_bias if self.final_logits_bias is not None else logits

    def shift_right(self, labels: torch.Tensor) -> torch.Tensor:
        """Teacher forcing: the decoder reads [start, y1, ..., y_{T-1}] to predict [y1, ..., yT]."""
        start = self.config.decoder_start_token_id
        if start is None:
            raise TformerError("decoder_start_token_id is not set; set it in the config or pass decoder_input_ids")
        shifted = labels.new_full(labels.shape, start)
        shifted[:, 1:] = labels[:, :-1]
        pad = self.config.pad_token_id if self.config.pad_token_id is not None else start
        return shifted.masked_fill(shifted == -100, pad)

    def forward(
        self,
        input_ids: torch.Tensor | None = None,  # (B, S) source
        attention_mask: torch.Tensor | None = None,  # (B, S)
        decoder_input_ids: torch.Tensor | None = None,  # (B, T) target, shifted right
        decoder_attention_mask: torch.Tensor | None = None,  # (B, past + T)
        encoder_outputs: torch.Tensor | None = None,  # reuse a memory already computed
        past_key_values: KVCache | None = None,
        use_cache: bool = False,
        labels: torch.Tensor | None = None,  # (B, T), not shifted; -100 = ignore
        output_attentions: bool = False,
    ) -> ModelOutput:
        enc_w = None
        if encoder_outputs is None:
            encoder_outputs, enc_w = self.encode(input_ids, attention_mask, output_attentions)
        if decoder_input_ids is None:
            if labels is None:
                raise TformerError("an encoder-decoder model needs decoder_input_ids (or labels to shift right)")
            decoder_input_ids = self.shift_right(labels)
        cache = past_key_values if past_key_values is not None else (self.new_cache() if use_cache else None)
        logits, h, self_w, cross_w = self.decode(
            decoder_input_ids, encoder_outputs, attention_mask, decoder_attention_mask,
            cache=cache, output_attentions=output_attentions,
        )
        return ModelOutput(
            logits=logits,
            last_hidden_state=h,
            loss=lm_loss(logits, labels, shift=False) if labels is not None else None,
            encoder_last_hidden_state=encoder_outputs,
            past_key_values=cache,
            attentions=self_w if output_attentions else None,
            cross_attentions=cross_w if output_attentions else None,
            encoder_attentions=enc_w if output_attentions else None,
        )
