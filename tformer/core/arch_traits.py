"""What each architecture has and accepts: one row per architecture (ArchTraits), and the
architecture-specific config fields with the message a field gets where it does not apply.

No torch: the ledger and the CLI read these rows without building a model.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class ArchTraits:
    """What an architecture has. Code outside model/ and cost/ asks these, never the arch's name,
    so a new architecture is one row here (plus its model file and runner)."""

    encoder: bool  # a bidirectional stack that reads the whole input
    decoder: bool  # a causal stack that generates tokens
    objective: str  # what it trains on: causal (next token), mlm (masked tokens), seq2seq (teacher forcing)
    label: str  # what it is, for messages: "... is {label}"
    # Phases a step can run, and the ones `tformer profile --phase all` and the report compare
    # (where there is a prefill it stands for the plain forward pass).
    phases: tuple[str, ...]
    compared_phases: tuple[str, ...]
    fields: frozenset[str] = frozenset()  # the architecture-specific config fields it accepts
    recurrent: bool = False  # no attention: a recurrent layer (cell, d_hidden); heads and positions are not read
    images: bool = False  # reads pixel values cut into patches (image_size, patch_size, num_channels)

    @property
    def seq2seq(self) -> bool:
        """Reads a source and generates a target (the prompt is the source, not the decoder's prefix)."""
        return self.encoder and self.decoder

    @property
    def decoder_only(self) -> bool:
        """A causal Transformer stack alone (GPT-2, LLaMA): its prompt is its own prefix, it has attention."""
        return self.decoder and not self.encoder and not self.recurrent

    @property
    def text_encoder(self) -> bool:
        """A bidirectional stack over tokens alone (BERT and its variants)."""
        return self.encoder and not self.decoder and not self.images and not self.recurrent

    @property
    def two_towers(self) -> bool:
        """An image tower and a text tower projected into one embedding space (CLIP)."""
        return self.objective == "contrastive"

    @property
    def vision_only(self) -> bool:
        """Reads images and nothing else (ViT): no token ids, no sequence length of its own."""
        return self.images and not self.two_towers


_IMAGE_FIELDS = frozenset({"image_size", "patch_size", "num_channels"})
_TASK_FIELDS = frozenset({"task", "pooling", "n_classes"})  # a task head in place of the LM head
_DECODING = ("forward", "train", "prefill", "decode")
ARCH_TRAITS = {
    "decoder": ArchTraits(encoder=False, decoder=True, objective="causal", label="a decoder-only model",
                          phases=_DECODING, compared_phases=("train", "prefill", "decode"), fields=_TASK_FIELDS),
    "encoder": ArchTraits(encoder=True, decoder=False, objective="mlm", label="an encoder-only model (no decoder)",
                          phases=("forward", "train"), compared_phases=("train", "forward"),
                          fields=frozenset({"type_vocab_size", "pooler", "lm_head", "embed_dim", "share_layers",
                                            "pair_head"}) | _TASK_FIELDS),
    "encoder-decoder": ArchTraits(encoder=True, decoder=True, objective="seq2seq", label="an encoder-decoder model",
                                  phases=_DECODING, compared_phases=("train", "prefill", "decode"),
                                  fields=frozenset({"n_decoder_layers"})),
    "rnn": ArchTraits(encoder=False, decoder=True, objective="causal", label="a recurrent language model",
                      phases=_DECODING, compared_phases=("train", "prefill", "decode"),
                      fields=frozenset({"cell", "d_hidden", "rnn_teaching"}), recurrent=True),
    "rnn-seq2seq": ArchTraits(encoder=True, decoder=True, objective="seq2seq",
                              label="a recurrent encoder-decoder model", phases=_DECODING,
                              compared_phases=("train", "prefill", "decode"),
                              fields=frozenset({"cell", "d_hidden", "rnn_teaching", "rnn_attention", "bidirectional",
                                                "rnn_input_feeding"}), recurrent=True),
    # Dosovitskiy et al. 2020: an encoder over patches + [CLS]; the classifier reads the [CLS] state.
    "vit": ArchTraits(encoder=True, decoder=False, objective="image-classification",
                      label="a vision Transformer (it reads images, not text)", phases=("forward", "train"),
                      compared_phases=("train", "forward"), images=True, fields=_IMAGE_FIELDS | {"n_classes", "patch_bias"}),
    # Radford et al. 2021: a ViT and a causal text Transformer, each projected into one embedding space.
    # The text tower reads the shared fields (d_model, n_layers, ...); the vision tower the vision_* ones.
    "clip": ArchTraits(encoder=True, decoder=False, objective="contrastive",
                       label="an image-text model (CLIP: two towers, one embedding space)", phases=("forward", "train"),
                       compared_phases=("train", "forward"), images=True,
                       fields=_IMAGE_FIELDS | {"vision_n_layers", "vision_d_model", "vision_n_heads", "vision_d_ff",
                                               "projection_dim", "logit_scale_init"}),
}
ARCHS = tuple(ARCH_TRAITS)
# Architecture-specific fields: (is it in use?, the error when the architecture does not accept it).
ARCH_FIELDS = {
    "n_decoder_layers": (lambda c: c.n_decoder_layers is not None,
                         "n_decoder_layers only applies to arch='encoder-decoder'; use n_layers instead"),
    "type_vocab_size": (lambda c: bool(c.type_vocab_size),
                        "type_vocab_size (segment embeddings) only applies to arch='encoder'"),
    "pooler": (lambda c: bool(c.pooler), "pooler only applies to arch='encoder'"),
    "lm_head": (lambda c: not c.lm_head and not c.task,
                "a {arch} model needs its LM head; lm_head=false is only for encoders (or give it a task head: task=...)"),
    "embed_dim": (lambda c: c.embed_dim is not None,
                  "embed_dim (ALBERT's factorised embedding) only applies to arch='encoder'; leave it unset"),
    "share_layers": (lambda c: c.share_layers, "share_layers (ALBERT's one layer across depth) only applies to "
                                               "arch='encoder'; set share_layers=false"),
    "pair_head": (lambda c: c.pair_head, "pair_head (NSP/SOP classifier) only applies to arch='encoder'"),
    "cell": (lambda c: c.cell is not None, "cell (lstm, gru, rnn) only applies to arch='rnn' and 'rnn-seq2seq'"),
    "d_hidden": (lambda c: c.d_hidden is not None,
                 "d_hidden (the recurrent state's width) only applies to arch='rnn' and 'rnn-seq2seq'"),
    "rnn_teaching": (lambda c: c.rnn_teaching,
                     "rnn_teaching (the written-out cells) only applies to arch='rnn' and 'rnn-seq2seq'"),
    "rnn_attention": (lambda c: c.rnn_attention is not None,
                      "rnn_attention (Bahdanau or Luong) only applies to arch='rnn-seq2seq'"),
    "bidirectional": (lambda c: c.bidirectional, "bidirectional (the recurrent encoder read both ways) only applies "
                                                 "to arch='rnn-seq2seq'"),
    "rnn_input_feeding": (lambda c: c.rnn_input_feeding is not None,
                          "rnn_input_feeding (Luong's) only applies to arch='rnn-seq2seq'"),
    **{name: (lambda c, name=name: getattr(c, name) is not None,
              f"{name} (the image input) only applies to arch='vit' and 'clip'")
       for name in ("image_size", "patch_size", "num_channels")},
    "n_classes": (lambda c: bool(c.n_classes), "n_classes (a classifier's classes) only applies to arch='vit' and to "
                                               "an encoder or decoder with a task head (task=...)"),
    "task": (lambda c: bool(c.task), "task (a classification or question-answering head) only applies to "
                                     "arch='encoder' and 'decoder'"),
    "pooling": (lambda c: c.pooling is not None, "pooling only applies to task='sequence-classification'"),
    "patch_bias": (lambda c: not c.patch_bias, "patch_bias=false only applies to arch='vit'"),
    **{name: (lambda c, name=name: getattr(c, name) is not None, f"{name} (CLIP's vision tower) only applies to arch='clip'")
       for name in ("vision_n_layers", "vision_d_model", "vision_n_heads", "vision_d_ff", "projection_dim")},
    "logit_scale_init": (lambda c: c.logit_scale_init != CLIP_LOGIT_SCALE,
                         "logit_scale_init (CLIP's learned temperature) only applies to arch='clip'"),
}
# CLIP's initial temperature, ln(1 / 0.07) as the released configs round it: logits = cosine / 0.07.
CLIP_LOGIT_SCALE = 2.6592
