"""One record per architecture: what it is (its traits: what it has, trains on and accepts) and the
names of the three pieces that run it: its describer (cost), its model class and its runner (model).

A new architecture is one record here plus its describer, model file and runner.

Why the pieces are named, not imported. core is the bottom layer and never imports cost, model or
torch (docs/ARCHITECTURE.md, the import contract), yet the CLI and the ledger read the traits without
building a model. So a record names each piece as "module:attribute", as Hugging Face's auto-mappings
name classes by string, and each layer resolves only the names of its own role, when first asked:
cost the describer (tformer.cost.architecture.describe), model the model class and the runner
(tformer.model.records). ``ArchRecord.resolve`` is the one resolver; it refuses a name whose module
lies outside the layer that owns the role, and an asker outside that layer, so a record can make
neither core nor cost import torch: the contract lint-imports checks on the static imports holds for
these names too. By the time a name is asked for, its layer is loaded or loading; core imports nothing.

Also here: the architecture-specific config fields, with the message a field gets where it does not apply.
No torch.
"""

from __future__ import annotations

import importlib
from dataclasses import dataclass
from functools import cache

from tformer.core.errors import TformerError

# Which layer owns each named piece: only that layer may ask for it, and the name must lie inside it.
ROLES = {"describer": "tformer.cost", "model": "tformer.model", "runner": "tformer.model"}


@dataclass(frozen=True)
class ArchRecord:
    """What an architecture is. Code outside model/ and cost/ asks these traits, never the arch's name."""

    name: str  # config.arch
    encoder: bool  # a bidirectional stack that reads the whole input
    decoder: bool  # a causal stack that generates tokens
    objective: str  # what it trains on: causal (next token), mlm (masked tokens), seq2seq (teacher forcing)
    label: str  # what it is, for messages: "... is {label}"
    # Phases a step can run, and the ones `tformer profile --phase all` and the report compare
    # (where there is a prefill it stands for the plain forward pass).
    phases: tuple[str, ...]
    compared_phases: tuple[str, ...]
    # The pieces, as "module:attribute" (see the module docstring):
    describer: str  # tformer.cost.*: config -> tformer.cost.description.Architecture (blocks, paths, shapes)
    model: str  # tformer.model.*: the nn.Module class (a TransformerModel), built from that description
    runner: str  # tformer.model.*: the Runner class, what train/generate/measure talk to
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

    def resolve(self, role: str, asker: str, kind: type | None = None):
        """The object this record names for ``role`` (describer, model or runner), for the module ``asker``
        (its ``__name__``): a subclass of ``kind`` where given, else a callable. Each refusal is one line."""
        layer = ROLES.get(role)
        if layer is None:
            raise TformerError(f"an architecture record names no '{role}'; it names: {', '.join(ROLES)}")
        if not _within(asker, layer):
            raise TformerError(f"{asker} may not resolve an architecture's {role}: only {layer} does (the layers "
                               "import downward only; see docs/ARCHITECTURE.md)")
        ref = getattr(self, role)
        module, _, attribute = ref.partition(":")
        if not attribute or not _within(module, layer):
            raise TformerError(f"arch '{self.name}': its {role} '{ref}' must be 'module:attribute' with the module "
                               f"in {layer} (the layer that resolves {role}s)")
        found = _load(module, attribute)
        right = isinstance(found, type) and issubclass(found, kind) if kind is not None else callable(found)
        if not right:
            raise TformerError(f"arch '{self.name}': its {role} '{ref}' is not "
                               f"{'a subclass of ' + kind.__name__ if kind is not None else 'callable'}")
        return found


def _within(module: str, layer: str) -> bool:
    return module == layer or module.startswith(layer + ".")


@cache
def _load(module: str, attribute: str):
    try:
        found = importlib.import_module(module)
    except ModuleNotFoundError as e:
        if e.name != module:  # the module exists but fails to import: its own error says why
            raise
        raise TformerError(f"architecture records name module '{module}', which does not exist") from None
    try:
        return getattr(found, attribute)
    except AttributeError:
        raise TformerError(f"architecture records name '{module}:{attribute}', which {module} does not "
                           "define") from None


_IMAGE_FIELDS = frozenset({"image_size", "patch_size", "num_channels"})
_TASK_FIELDS = frozenset({"task", "pooling", "n_classes"})  # a task head in place of the LM head
_DECODING = ("forward", "train", "prefill", "decode")
_DESCRIBE = "tformer.cost.architecture:"
_RUN = "tformer.model.runners:"
RECORDS = (
    ArchRecord(name="decoder", encoder=False, decoder=True, objective="causal", label="a decoder-only model",
               phases=_DECODING, compared_phases=("train", "prefill", "decode"), fields=_TASK_FIELDS,
               describer=_DESCRIBE + "describe_decoder", model="tformer.model.decoder:DecoderLM",
               runner=_RUN + "DecoderRunner"),
    ArchRecord(name="encoder", encoder=True, decoder=False, objective="mlm", label="an encoder-only model (no decoder)",
               phases=("forward", "train"), compared_phases=("train", "forward"),
               fields=frozenset({"type_vocab_size", "pooler", "lm_head", "embed_dim", "share_layers",
                                 "pair_head"}) | _TASK_FIELDS,
               describer=_DESCRIBE + "describe_encoder", model="tformer.model.encoder:EncoderModel",
               runner=_RUN + "Runner"),
    ArchRecord(name="encoder-decoder", encoder=True, decoder=True, objective="seq2seq",
               label="an encoder-decoder model", phases=_DECODING, compared_phases=("train", "prefill", "decode"),
               fields=frozenset({"n_decoder_layers"}),
               describer=_DESCRIBE + "describe_encoder_decoder",
               model="tformer.model.encoder_decoder:EncoderDecoderModel", runner=_RUN + "EncoderDecoderRunner"),
    ArchRecord(name="rnn", encoder=False, decoder=True, objective="causal", label="a recurrent language model",
               phases=_DECODING, compared_phases=("train", "prefill", "decode"),
               fields=frozenset({"cell", "d_hidden", "rnn_teaching"}), recurrent=True,
               describer=_DESCRIBE + "describe_rnn", model="tformer.model.rnn_lm:RecurrentLM",
               runner=_RUN + "RecurrentRunner"),
    ArchRecord(name="rnn-seq2seq", encoder=True, decoder=True, objective="seq2seq",
               label="a recurrent encoder-decoder model", phases=_DECODING,
               compared_phases=("train", "prefill", "decode"),
               fields=frozenset({"cell", "d_hidden", "rnn_teaching", "rnn_attention", "bidirectional",
                                 "rnn_input_feeding"}), recurrent=True,
               describer=_DESCRIBE + "describe_rnn_seq2seq", model="tformer.model.rnn_seq2seq:RecurrentSeq2Seq",
               runner=_RUN + "RecurrentSeq2SeqRunner"),
    # Dosovitskiy et al. 2020: an encoder over patches + [CLS]; the classifier reads the [CLS] state.
    ArchRecord(name="vit", encoder=True, decoder=False, objective="image-classification",
               label="a vision Transformer (it reads images, not text)", phases=("forward", "train"),
               compared_phases=("train", "forward"), images=True, fields=_IMAGE_FIELDS | {"n_classes", "patch_bias"},
               describer=_DESCRIBE + "describe_vit", model="tformer.model.vit:ViTModel",
               runner=_RUN + "Runner"),
    # Radford et al. 2021: a ViT and a causal text Transformer, each projected into one embedding space.
    # The text tower reads the shared fields (d_model, n_layers, ...); the vision tower the vision_* ones.
    ArchRecord(name="clip", encoder=True, decoder=False, objective="contrastive",
               label="an image-text model (CLIP: two towers, one embedding space)", phases=("forward", "train"),
               compared_phases=("train", "forward"), images=True,
               fields=_IMAGE_FIELDS | {"vision_n_layers", "vision_d_model", "vision_n_heads", "vision_d_ff",
                                       "projection_dim", "logit_scale_init"},
               describer=_DESCRIBE + "describe_clip", model="tformer.model.clip:CLIPModel",
               runner=_RUN + "ContrastiveRunner"),
)
ARCH_RECORDS = {r.name: r for r in RECORDS}
ARCHS = tuple(ARCH_RECORDS)


def arch_record(arch: str) -> ArchRecord:
    """The record of ``arch``; an unknown one is one line naming the known ones."""
    record = ARCH_RECORDS.get(arch) if isinstance(arch, str) else None
    if record is None:
        raise TformerError(f"arch={arch!r} is unknown; choose one of: {', '.join(ARCHS)} (each a record in "
                           "tformer/core/architectures.py)")
    return record


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

__all__ = ["ARCHS", "ARCH_FIELDS", "ARCH_RECORDS", "CLIP_LOGIT_SCALE", "RECORDS", "ROLES", "ArchRecord",
           "arch_record"]
