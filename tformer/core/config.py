"""ModelConfig: one dataclass that describes every model in the family.

The same config drives the model (tformer.model), the ledger (tformer.cost) and the
measurements (tformer.measure), so the three can be held equal by tests.
"""

from __future__ import annotations

import dataclasses
import difflib
import json
import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from tformer.core.architectures import (  # noqa: F401 (ARCH_RECORDS: re-exported for callers)
    ARCH_FIELDS, ARCH_RECORDS, ARCHS, CLIP_LOGIT_SCALE, ArchRecord, arch_record)
from tformer.core.attention_kinds import ATTN_IMPLS, ATTN_KINDS, AttnOptions
from tformer.core.errors import TformerError
from tformer.core.files import FileFormatError, read_json
from tformer.core.config_choices import (  # noqa: F401 (re-exported for callers)
    ACTIVATIONS, CELLS, LAYER_TYPES, MLP_SHORTHANDS, NORMS, PLACEMENTS, POOLINGS, POSITIONS, RNN_ATTENTIONS,
    ROPE_SCALINGS, TASKS)
from tformer.core.config_values import choice as _choice, coerce as _coerce, divisor_near as _divisor_near
from tformer.core.config_values import quoted as _quoted, whole as _whole
from tformer.core.presets import PRESETS
from tformer.core.quant_formats import (  # noqa: F401 (re-exported for callers)
    BLOCK_GROUPS, QUANT_BITS, QUANT_GROUPS, QUANTIZATIONS, layer_formats)


MAX_CONFIG_BYTES = 16 << 20  # a config.json is a few KB; anything this big is not one

# Layers per stack. The deepest published Transformer has 1000 (DeepNet); the ledger lists every op of
# every layer, so an absurd count (a typo, a --factor of 1e9) would run for hours instead of failing.
MAX_LAYERS = 4096

# Fields that may be left unset (None) and then follow the others.
DERIVED = {
    "n_kv_heads": lambda c: c.n_heads,  # multi-head attention: one key/value head per query head
    "head_dim": lambda c: c.d_model // c.n_heads,
    "n_decoder_layers": lambda c: c.n_layers if c.traits.seq2seq else None,
    "cell": lambda c: "lstm" if c.traits.recurrent else None,
    "d_hidden": lambda c: c.d_model if c.traits.recurrent else None,
    # An architecture-specific field's default applies where the architecture accepts the field.
    "rnn_attention": lambda c: "bahdanau" if "rnn_attention" in c.traits.fields else None,
    "rnn_input_feeding": lambda c: True if "rnn_input_feeding" in c.traits.fields else None,
    "image_size": lambda c: 224 if c.traits.images else None,
    "patch_size": lambda c: 16 if c.traits.images else None,
    "num_channels": lambda c: 3 if c.traits.images else None,
    "vision_n_layers": lambda c: c.n_layers if "vision_n_layers" in c.traits.fields else None,
    "vision_d_model": lambda c: c.d_model if "vision_d_model" in c.traits.fields else None,
    "vision_n_heads": lambda c: c.n_heads if "vision_n_heads" in c.traits.fields else None,
    "vision_d_ff": lambda c: c.d_ff if "vision_d_ff" in c.traits.fields else None,
    "projection_dim": lambda c: c.d_model if "projection_dim" in c.traits.fields else None,
    "pooling": lambda c: ("last" if c.traits.decoder else "cls") if c.task == "sequence-classification" else None,
    "quant_group": lambda c: 32 if "int4" in (c.quantize, c.quantize_head) else None,
    "quantize_head": lambda c: "none" if c.quantize == "mixed" else c.quantize,
}


@dataclass
class ModelConfig:
    """Everything needed to build a Transformer of this family.

    Sizes follow the papers' names: d_model, n_heads, d_ff. For an encoder-decoder,
    ``n_layers`` counts encoder layers and ``n_decoder_layers`` decoder layers.
    """

    arch: str = "decoder"
    n_layers: int = 4
    n_decoder_layers: int | None = None  # encoder-decoder only; None = same as n_layers
    d_model: int = 256
    n_heads: int = 4
    n_kv_heads: int | None = None  # < n_heads: grouped-query attention; 1: multi-query
    head_dim: int | None = None  # None = d_model // n_heads (T5 may differ)
    d_ff: int = 1024
    vocab_size: int = 65
    max_positions: int = 128

    # Positions: added to the embeddings (learned, sinusoidal), rotating q/k (rope),
    # or a bias on the attention scores (alibi, relative = T5 buckets).
    position: str = "learned"
    position_offset: int = 0  # BART's learned table starts at index 2
    # (an encoder with an offset counts positions over its non-pad tokens, pads at row offset - 1: RoBERTa)
    rope_theta: float = 10000.0
    # Longer context for a RoPE model: linear position interpolation, NTK-aware (a larger theta),
    # dynamic NTK (theta grows with the sequence past the trained length), YaRN (per-frequency blend).
    rope_scaling: str = "none"
    rope_factor: float = 1.0  # how many times the trained context the model should reach
    rope_original_positions: int | None = None  # the context trained at (dynamic, yarn); None = max_positions
    rope_beta_fast: float = 32.0  # YaRN: rotations per trained context above which a frequency is kept
    rope_beta_slow: float = 1.0  # YaRN: ... below which it is interpolated fully
    rope_attention_factor: float | None = None  # YaRN: cos/sin scale; None = 0.1 ln(factor) + 1
    # llama3: frequencies whose wavelength exceeds original / low are divided by rope_factor, those under
    # original / high kept, a smooth blend between (Llama 3.1-3.3's 1 and 4)
    rope_low_freq_factor: float = 1.0
    rope_high_freq_factor: float = 4.0
    rope_local_theta: float | None = None  # RoPE base of the sliding layers (Gemma 3: 10,000); None = rope_theta
    relative_attention_num_buckets: int = 32
    relative_attention_max_distance: int = 128

    norm: str = "layernorm"
    norm_placement: str = "pre"  # post = the 2017 paper and BERT; pre = GPT-2, LLaMA, T5
    norm_eps: float = 1e-5
    final_norm: bool = True  # a norm after the last layer of each stack
    embedding_norm: bool = False  # a norm right after the embeddings (BERT, BART)
    qk_norm: bool = False  # a norm over each head's query and key before RoPE (Gemma 3)

    activation: str = "gelu"
    gated_mlp: bool = False  # act(gate(x)) * up(x): SwiGLU when activation is silu
    bias: bool = True  # biases in the linear layers
    qkv_bias: bool | None = None  # biases on the query, key and value projections alone (Qwen2); None: as ``bias``

    tied_embeddings: bool = True  # LM head shares the token embedding matrix
    scale_embeddings: bool = False  # token embeddings * sqrt(d_model) (2017 paper)
    scale_attention: bool = True  # scores / sqrt(head_dim); T5 folds this into init
    rescale_tied_head: bool = False  # T5: hidden * d_model**-0.5 before a tied head

    type_vocab_size: int = 0  # BERT's segment embeddings
    pooler: bool = False  # BERT: dense + tanh on the first token
    lm_head: bool = True  # encoder: the MLM head; decoder: the LM head
    final_logits_bias: bool = False  # BART: a fixed (buffer) bias on the logits
    # ALBERT (Lan et al. 2019): tables of width embed_dim (E), projected to d_model; None = d_model,
    # no projection. share_layers: one layer's weights run n_layers times.
    embed_dim: int | None = None
    share_layers: bool = False
    pair_head: bool = False  # a 2-class classifier on the pooler: BERT's NSP, ALBERT's SOP

    # arch='rnn': embedding (d_model) -> n_layers recurrent layers of width d_hidden -> LM head.
    cell: str | None = None  # lstm | gru | rnn (Elman, tanh); None = lstm
    d_hidden: int | None = None  # the hidden state's width; None = d_model
    rnn_teaching: bool = False  # run the written-out cells (tformer.model.rnn) instead of torch's kernel
    # arch='rnn-seq2seq': a recurrent encoder (n_layers, optionally bidirectional) and decoder (n_layers)
    # joined by attention over the encoder's outputs: bahdanau (additive), luong-dot, luong-general, none.
    rnn_attention: str | None = None  # None = bahdanau
    bidirectional: bool = False  # encoder only; its 2 x d_hidden outputs and states are bridged to d_hidden
    rnn_input_feeding: bool | None = None  # Luong: feed the last attentional vector to the next step; None = true

    # arch='vit' and 'clip': square images of image_size pixels and num_channels channels, cut into
    # (image_size / patch_size)^2 patches, each one token, after a [CLS] token: n = HW / P^2 + 1.
    image_size: int | None = None  # None = 224
    patch_size: int | None = None  # None = 16
    num_channels: int | None = None  # None = 3 (RGB)
    n_classes: int = 0  # vit: the classifier's classes on the [CLS] state; 0 = no head (features only)
    patch_bias: bool = True  # vit: the patch projection has a bias (CLIP's has none)
    # arch='clip': the vision tower's sizes (None = the text tower's), the shared embedding's width,
    # and the learned temperature's initial log value.
    vision_n_layers: int | None = None
    vision_d_model: int | None = None
    vision_n_heads: int | None = None
    vision_d_ff: int | None = None
    projection_dim: int | None = None  # None = d_model
    logit_scale_init: float = CLIP_LOGIT_SCALE

    # arch='encoder' and 'decoder': a task head replaces the LM head. sequence-classification reads one vector
    # per sequence (pooling) into n_classes (1: regression); token-classification scores every token;
    # question-answering scores each token as an answer span's start and end.
    task: str = ""
    pooling: str | None = None  # None = cls (encoder), last (decoder)
    # Weight-only quantization; quant_group: int4's inputs per scale (None = 32; int8 has one scale per row).
    # quantize_head: the LM head's (None = as quantize); a GGUF file may keep it in another format than the layers.
    # quantize="mixed": each layer's Linears as quantize_layers says, one entry per layer (core.quant_formats).
    quantize: str = "none"
    quant_group: int | None = None
    quantize_head: str | None = None
    quantize_layers: list[str] | None = None

    dropout: float = 0.0
    attention_dropout: float = 0.0
    activation_dropout: float = 0.0

    # The attention kind (tformer.core.attention_kinds.ATTN_KINDS) and the settings the kinds read.
    # Exact kinds run every attention; sparse and approximate kinds run self-attention only
    # (cross-attention stays exact: sdpa).
    attn_impl: str = "sdpa"  # sdpa = fast path; reference = step by step, returns weights
    attn_window: int | None = None  # sliding / strided / longformer: keys in each query's window
    attn_dilation: int | list[int] = 1  # gap between window keys; a list gives one per layer
    # Per layer "full" (attn_impl over every key) or "sliding" (the last attn_window keys): Gemma 3's five local
    # layers to one global. None: every layer runs attn_impl.
    layer_types: list[str] | None = None
    attn_scale_dim: int | None = None  # scores / sqrt(this) (Gemma's query_pre_attn_scalar); None = head_dim
    logit_softcap: float | None = None  # logits -> cap * tanh(logits / cap) (Gemma 2; large Gemma 3)
    attn_global: int = 0  # longformer / bigbird: leading tokens that see and are seen by every token
    attn_block: int = 64  # tile, chunk, block or bucket size in tokens (the kinds' rows say which read it)
    attn_random: int = 3  # bigbird: random key blocks per query block (fixed at init)
    attn_features: int = 256  # performer: random features
    attn_proj: int = 256  # linformer: keys and values projected to this many rows (k)
    attn_hashes: int = 1  # lsh: hash rounds
    attn_seed: int = 0  # seeds random blocks, features and hashes (with the layer index)

    pad_token_id: int | None = None
    bos_token_id: int | None = None
    eos_token_id: int | None = None
    decoder_start_token_id: int | None = None

    name: str = field(default="custom", compare=False)

    def __post_init__(self) -> None:
        self.validate()
        # A size left unset follows the others (head_dim = d_model / n_heads, ...). It is filled in
        # here, so the rest of the code reads one name per concept; to_dict() writes it back as unset,
        # so replace(d_model=...) derives it again instead of keeping the old value.
        derived = {name for name in DERIVED if getattr(self, name) is None}
        object.__setattr__(self, "_derived", frozenset(derived))
        for name in derived:
            setattr(self, name, DERIVED[name](self))

    @property
    def traits(self) -> ArchRecord:
        """What the architecture is (tformer.core.architectures): ask this, never ``arch``'s name."""
        return arch_record(self.arch)

    @property
    def has_encoder(self) -> bool:
        return self.traits.encoder

    @property
    def has_decoder(self) -> bool:
        return self.traits.decoder

    # Validation --------------------------------------------------------------------
    @property
    def qkv_has_bias(self) -> bool:
        """Whether the query, key and value projections carry biases (qkv_bias, else the one ``bias`` switch)."""
        return self.bias if self.qkv_bias is None else self.qkv_bias

    def validate(self) -> None:
        def choice(name: str, options: tuple[str, ...]) -> None:
            _choice(name, getattr(self, name), options)

        choice("arch", ARCHS)
        choice("position", POSITIONS)
        choice("norm", NORMS)
        choice("norm_placement", PLACEMENTS)
        choice("activation", ACTIVATIONS)
        choice("attn_impl", ATTN_IMPLS)
        choice("rope_scaling", ROPE_SCALINGS)
        if self.cell is not None:
            choice("cell", CELLS)
        if self.d_hidden is not None:
            _whole("d_hidden", self.d_hidden, low=1)
        if self.rnn_attention is not None:
            choice("rnn_attention", RNN_ATTENTIONS)
        if self.qkv_bias is not None and not isinstance(self.qkv_bias, bool):
            raise TformerError(f"qkv_bias must be true, false or null (as bias), got {self.qkv_bias!r}")
        if self.rnn_input_feeding is not None and not isinstance(self.rnn_input_feeding, bool):
            raise TformerError(f"rnn_input_feeding must be true or false, got {self.rnn_input_feeding!r}")
        attention = self.rnn_attention or "bahdanau"
        feeding = "rnn_input_feeding" in self.traits.fields  # Luong's decoder can read its last output
        if self.rnn_input_feeding is False and feeding and not attention.startswith("luong"):
            raise TformerError(f"rnn_input_feeding is Luong's; rnn_attention='{attention}' has none to turn off "
                               "(drop rnn_input_feeding, or use luong-dot / luong-general)")

        positive = ["n_layers", "d_model", "n_heads", "d_ff", "vocab_size", "max_positions"]
        optional_positive = ["n_decoder_layers", "n_kv_heads", "head_dim"]
        for name in positive + optional_positive:
            value = getattr(self, name)
            if value is None and name in optional_positive:
                continue
            if isinstance(value, bool) or not isinstance(value, int):
                raise TformerError(f"{name} must be a whole number, got {value!r}")
            if value <= 0:
                raise TformerError(f"{name} must be positive, got {value}; set it to 1 or more")
        for name in ("n_layers", "n_decoder_layers"):
            if (getattr(self, name) or 0) > MAX_LAYERS:
                raise TformerError(f"{name}={getattr(self, name)} is beyond the {MAX_LAYERS} layers tformer "
                                   f"models; use {MAX_LAYERS} or fewer")
        if self.embed_dim is not None:
            _whole("embed_dim", self.embed_dim, low=1)
        if self.pair_head and not self.pooler and "pair_head" in self.traits.fields:
            raise TformerError("pair_head classifies the pooler's output; set pooler=true (or pair_head=false)")
        if self.share_layers and isinstance(self.attn_dilation, list):
            raise TformerError("share_layers runs one layer at every depth, so it takes one attn_dilation, not a list")
        for name in ("position_offset", "type_vocab_size"):
            if getattr(self, name) < 0:
                raise TformerError(f"{name} must be 0 or more, got {getattr(self, name)}")
        if self.head_dim is None and self.d_model % self.n_heads and not self.traits.recurrent:
            raise TformerError(
                f"d_model={self.d_model} is not divisible by n_heads={self.n_heads}; "
                f"pick n_heads that divides d_model (e.g. {_divisor_near(self.d_model, self.n_heads)}) or set head_dim"
            )
        kv_heads = self.n_kv_heads if self.n_kv_heads is not None else self.n_heads
        head_dim = self.head_dim if self.head_dim is not None else self.d_model // self.n_heads
        if self.n_heads % kv_heads:
            raise TformerError(
                f"n_kv_heads={kv_heads} does not divide n_heads={self.n_heads}; "
                "each key/value head must serve a whole group of query heads"
            )
        if self.position == "rope" and head_dim % 2:
            raise TformerError(f"RoPE rotates pairs of features, so head_dim must be even, got {head_dim}")
        for name in ("dropout", "attention_dropout", "activation_dropout"):
            p = getattr(self, name)
            if not 0.0 <= p < 1.0:
                raise TformerError(f"{name} must be in [0, 1), got {p}")
        for name in ("norm_eps", "rope_theta"):  # nan and inf pass a bare `<= 0` and poison every activation
            if not 0 < getattr(self, name) < math.inf:
                raise TformerError(f"{name} must be a finite positive number, got {getattr(self, name)}")
        self._validate_attention()
        self._validate_layer_types()
        self._validate_rope_scaling()
        self._validate_images()
        self._validate_task()
        self._validate_quantize()
        for name, (in_use, message) in ARCH_FIELDS.items():
            if in_use(self) and name not in self.traits.fields:
                raise TformerError(message.format(arch=self.arch))
        # A bidirectional stack halves the buckets, then keeps half of those for exact offsets:
        # fewer than 4 leaves no exact bucket and the log-spaced formula divides by zero.
        if self.relative_attention_num_buckets < 4 and self.position == "relative":
            raise TformerError("relative_attention_num_buckets must be at least 4")
        if self.position == "relative" and self.relative_attention_max_distance <= self.relative_attention_num_buckets // 2:
            raise TformerError(
                f"relative_attention_max_distance={self.relative_attention_max_distance} must exceed half the "
                f"buckets ({self.relative_attention_num_buckets // 2}): distances beyond the exact buckets are log-spaced up to it"
            )

    def _validate_attention(self) -> None:
        kind = ATTN_KINDS[self.attn_impl]
        for name in ("attn_block", "attn_random", "attn_features", "attn_proj", "attn_hashes"):
            _whole(name, getattr(self, name), low=0 if name == "attn_random" else 1)
        _whole("attn_global", self.attn_global, low=0)
        _whole("attn_seed", self.attn_seed, low=0)
        if self.attn_window is not None:
            _whole("attn_window", self.attn_window, low=1)
        layers = max(self.n_layers, self.n_decoder_layers or 0)
        dilations = self.attn_dilation if isinstance(self.attn_dilation, list) else [self.attn_dilation]
        if isinstance(self.attn_dilation, list) and len(dilations) != layers:
            raise TformerError(f"attn_dilation lists {len(dilations)} dilations for {layers} layers; "
                               "give one per layer, or one number for all")
        for d in dilations:
            _whole("attn_dilation", d, low=1)
        if "attn_window" in kind.options and self.attn_window is None:
            raise TformerError(f"attn_impl='{self.attn_impl}' needs attn_window (keys each query sees), "
                               "e.g. --set attn_window=256")
        if not kind.causal and (self.traits.decoder or self.traits.two_towers):  # CLIP's text tower is causal
            able = ", ".join(n for n, k in ATTN_KINDS.items() if k.causal)
            raise TformerError(f"attn_impl='{self.attn_impl}' cannot be causal ({kind.computed}, so every query "
                               f"would see later tokens); use it in an encoder (arch='encoder'), or choose one of: {able}")
        if not kind.position_bias and self.position in ("alibi", "relative"):
            raise TformerError(f"attn_impl='{self.attn_impl}' never forms the full score matrix, so it cannot add "
                               f"position='{self.position}' bias; use position='rope', 'learned' or 'sinusoidal'")

    def _validate_images(self) -> None:
        for name in ("image_size", "patch_size", "num_channels", "vision_n_layers", "vision_d_model", "vision_n_heads",
                     "vision_d_ff", "projection_dim"):
            if getattr(self, name) is not None:
                _whole(name, getattr(self, name), low=1)
        _whole("n_classes", self.n_classes, low=0)
        if not self.traits.images:
            return
        size, patch = self.image_size or 224, self.patch_size or 16
        if patch > size or size % patch:
            near = min((p for p in range(1, size + 1) if size % p == 0), key=lambda p: abs(p - patch))  # 1 divides
            raise TformerError(f"patch_size={patch} does not divide image_size={size} into whole patches; "
                               f"pick a patch size that divides it (e.g. {near}) or resize the images")
        if self.position != "learned":
            raise TformerError(f"arch='{self.arch}' places its patches with a learned table (position='learned'), "
                               f"not position='{self.position}'")
        if self.vision_d_model is not None and self.vision_d_model % (self.vision_n_heads or self.n_heads):
            raise TformerError(f"vision_d_model={self.vision_d_model} is not divisible by vision_n_heads="
                               f"{self.vision_n_heads or self.n_heads}; pick a head count that divides it")
        if not 0 <= self.logit_scale_init < math.inf:
            raise TformerError(f"logit_scale_init must be a finite number of at least 0, got {self.logit_scale_init}")

    def _validate_task(self) -> None:
        choice = _choice
        choice("task", self.task, TASKS)
        if self.pooling is not None:
            choice("pooling", self.pooling, POOLINGS)
            if self.task != "sequence-classification":
                raise TformerError("pooling only applies to task='sequence-classification'; drop it or set the task")
        if self.task in ("sequence-classification", "token-classification") and self.n_classes < 1:
            raise TformerError(f"task='{self.task}' needs its number of classes; set n_classes (e.g. --set n_classes=2; "
                               "1 = regression)")
        if self.task == "question-answering" and self.n_classes not in (0, 2):
            raise TformerError(f"task='question-answering' scores a start and an end per token (2 outputs), not "
                               f"n_classes={self.n_classes}; drop n_classes")
        if self.n_classes and not self.task and "task" in self.traits.fields:
            raise TformerError("n_classes sizes a task head; set task='sequence-classification' or "
                               "'token-classification' with it")

    def _validate_quantize(self) -> None:
        _choice("quantize", self.quantize, QUANTIZATIONS)
        if self.quantize_head is not None:
            _choice("quantize_head", self.quantize_head, QUANTIZATIONS[:-1])
        self._validate_quantize_layers()
        if self.quantize_head not in (None, "none") and not self.lm_head:
            raise TformerError(f"quantize_head={self.quantize_head} quantizes the LM head; this model has none: "
                               "drop quantize_head")
        asked = [f"{k}={v}" for k, v in (("quantize", self.quantize), ("quantize_head", self.quantize_head))
                 if v not in (None, "none")]
        if asked and self.traits.recurrent:
            raise TformerError(f"{asked[0]} covers a Transformer's Linears; {self.traits.label} keeps its recurrent "
                               f"weights in fused cells: keep it in float ({asked[0].split('=')[0]}=none)")
        if self.quant_group is None:
            return
        if "int4" not in (self.quantize, self.quantize_head):
            raise TformerError(f"quant_group sizes int4's groups; quantize='{self.quantize}' has none "
                               "(int8 keeps one scale per output row): drop quant_group or set quantize=int4")
        if self.quant_group not in QUANT_GROUPS:
            raise TformerError(f"quant_group={self.quant_group} is not a supported int4 group size; choose one of: "
                               f"{', '.join(map(str, QUANT_GROUPS))}")

    def _validate_quantize_layers(self) -> None:
        if (self.quantize == "mixed") != (self.quantize_layers is not None):
            raise TformerError("quantize='mixed' and quantize_layers go together: quantize_layers gives each layer's "
                               "formats; set both, or neither")
        if self.quantize_layers is None:
            return
        if self.traits.seq2seq or self.traits.images or self.traits.recurrent:
            raise TformerError(f"quantize_layers sets a one-stack Transformer's layers; {self.traits.label} has "
                               "several stacks: quantize it with one format (quantize=int8, int4, ...)")
        if not isinstance(self.quantize_layers, list) or len(self.quantize_layers) != self.n_layers:
            got = len(self.quantize_layers) if isinstance(self.quantize_layers, list) else "no list"
            raise TformerError(f"quantize_layers gives {got} layers for n_layers={self.n_layers}; give one per layer")
        for i, entry in enumerate(self.quantize_layers):
            layer_formats(entry, i)

    @property
    def image_tokens(self) -> int:
        """Tokens an image becomes: one per patch plus [CLS], n = HW / P^2 + 1 (vit and clip)."""
        if not self.traits.images:
            raise TformerError(f"{self.traits.label} reads no images; image_tokens is for arch='vit' and 'clip'")
        return (self.image_size // self.patch_size) ** 2 + 1

    def vision_tower(self) -> "ModelConfig":
        """arch='clip': its vision tower as a ViT config (features only: no classifier, no final norm over every
        token: CLIP normalises the pooled [CLS] state alone), with the pre-norm over the embeddings and a patch
        projection without bias, as the released models have."""
        if not self.traits.two_towers:
            raise TformerError(f"{self.traits.label} has no vision tower; vision_tower() is for arch='clip'")
        return ModelConfig(
            arch="vit", n_layers=self.vision_n_layers, d_model=self.vision_d_model, n_heads=self.vision_n_heads,
            d_ff=self.vision_d_ff, image_size=self.image_size, patch_size=self.patch_size, num_channels=self.num_channels,
            n_classes=0, patch_bias=False, norm=self.norm, norm_placement=self.norm_placement, norm_eps=self.norm_eps,
            final_norm=False, embedding_norm=True, activation=self.activation, bias=self.bias, dropout=self.dropout,
            attention_dropout=self.attention_dropout, activation_dropout=self.activation_dropout,
            attn_impl=self.attn_impl if ATTN_KINDS[self.attn_impl].family == "exact" else "sdpa",
            name=f"{self.name}/vision")

    def _validate_rope_scaling(self) -> None:
        if self.rope_scaling == "none":
            return
        if self.position != "rope":
            raise TformerError(f"rope_scaling='{self.rope_scaling}' rescales RoPE; it needs position='rope', "
                               f"not '{self.position}'")
        for name in ("rope_factor", "rope_beta_fast", "rope_beta_slow"):
            if not 0 < getattr(self, name) < math.inf:
                raise TformerError(f"{name} must be a finite positive number, got {getattr(self, name)}")
        if self.rope_factor < 1:
            raise TformerError(f"rope_factor must be at least 1 (how many times the trained context), got {self.rope_factor}")
        if self.rope_original_positions is not None:
            _whole("rope_original_positions", self.rope_original_positions, low=1)
        if self.rope_attention_factor is not None and not 0 < self.rope_attention_factor < math.inf:
            raise TformerError(f"rope_attention_factor must be a finite positive number, got {self.rope_attention_factor}")
        if self.rope_scaling == "llama3":
            low, high = self.rope_low_freq_factor, self.rope_high_freq_factor
            if not (0 < low < high < math.inf):
                raise TformerError(f"rope_low_freq_factor={low} and rope_high_freq_factor={high}: llama3 scaling "
                                   "needs 0 < low < high (Llama 3's 1 and 4)")
        if self.rope_scaling == "yarn" and self.rope_beta_fast < self.rope_beta_slow:
            raise TformerError(f"rope_beta_fast={self.rope_beta_fast} is below rope_beta_slow={self.rope_beta_slow}; "
                               "beta_fast counts the faster rotations (YaRN's defaults: 32 and 1)")

    def attention_options(self, layer: int) -> AttnOptions:
        """The attention settings of layer ``layer`` (its dilation when attn_dilation lists one per layer; its kind
        and window when layer_types gives each layer's)."""
        d = self.attn_dilation
        kind, window = self.attn_impl, self.attn_window
        if self.layer_types is not None:
            kind, window = ("sliding", window) if self.layer_types[layer] == "sliding" else (kind, None)
        return AttnOptions(kind=kind, layer=layer, window=window,
                           dilation=d[layer] if isinstance(d, list) else d, global_tokens=self.attn_global,
                           block=self.attn_block, random=self.attn_random, features=self.attn_features,
                           proj=self.attn_proj, hashes=self.attn_hashes, seed=self.attn_seed,
                           max_positions=self.max_positions)

    def rope_base(self, layer: int) -> float:
        """Layer ``layer``'s RoPE base: rope_local_theta on a sliding layer where it is set, else rope_theta."""
        sliding = self.layer_types is not None and self.layer_types[layer] == "sliding"
        return self.rope_local_theta if sliding and self.rope_local_theta is not None else self.rope_theta

    def _validate_layer_types(self) -> None:
        for name in ("rope_local_theta", "logit_softcap"):
            if getattr(self, name) is not None and not 0 < getattr(self, name) < math.inf:
                raise TformerError(f"{name} must be a finite positive number, got {getattr(self, name)}")
        if self.attn_scale_dim is not None:
            _whole("attn_scale_dim", self.attn_scale_dim, low=1)
        types = self.layer_types
        if types is None:
            if self.rope_local_theta is not None:
                raise TformerError("rope_local_theta is the RoPE base of sliding layers; give layer_types too")
            return
        if not self.traits.decoder_only:
            raise TformerError(f"layer_types sets a decoder-only model's layers; {self.traits.label} has none to set")
        if len(types) != self.n_layers:
            raise TformerError(f"layer_types lists {len(types)} layers for n_layers={self.n_layers}; give one per layer")
        for t in types:
            _choice("layer_types", t, LAYER_TYPES)
        if ATTN_KINDS[self.attn_impl].family != "exact":
            raise TformerError(f"layer_types gives each layer its kind (sliding, or attn_impl over every key); "
                               f"attn_impl='{self.attn_impl}' is not exact: use sdpa or reference")
        if "sliding" in types and self.attn_window is None:
            raise TformerError("layer_types has sliding layers: set attn_window (the keys each of their queries sees)")
        if "sliding" in types and self.attn_window > self.max_positions:
            raise TformerError(f"attn_window={self.attn_window} is larger than the context (max_positions="
                               f"{self.max_positions}): its sliding layers would be global; lower attn_window")

    # Conversions ---------------------------------------------------------------------
    def to_dict(self) -> dict[str, Any]:
        data = dataclasses.asdict(self)
        data.update({name: None for name in getattr(self, "_derived", ())})
        return data

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> "ModelConfig":
        data = dict(data)
        if "mlp" in data:  # shorthand: mlp=swiglu sets activation and gating together
            mlp = data.pop("mlp")
            if not isinstance(mlp, str) or mlp not in MLP_SHORTHANDS:  # a list or dict is unhashable
                raise TformerError(f"mlp={_quoted(mlp)} is unknown; choose one of: {', '.join(MLP_SHORTHANDS)}")
            data["activation"], data["gated_mlp"] = MLP_SHORTHANDS[mlp]
        known = {f.name for f in dataclasses.fields(cls)}
        unknown = sorted(set(data) - known)
        if unknown:
            hint = difflib.get_close_matches(unknown[0], known, n=1)
            extra = f" (did you mean '{hint[0]}'?)" if hint else ""
            raise TformerError(f"unknown config key {_quoted(unknown[0])}{extra}; valid keys: {', '.join(sorted(known))}")
        for f in dataclasses.fields(cls):
            if f.name in data:
                data[f.name] = _coerce(f.name, f.type, data[f.name])
        return cls(**data)

    @classmethod
    def from_file(cls, path: str | Path) -> "ModelConfig":
        """A tformer config JSON (a folder: its config.json). Hugging Face files, presets and
        checkpoint folders all go through tformer.interop.load_config."""
        path = Path(path)
        if path.is_dir():
            path = path / "config.json"
        data = read_config_json(path)
        if "model_type" in data:  # every HF config.json names its model_type; reading one is interop's job
            raise TformerError(f"config file {path} is a Hugging Face config.json; read it with "
                               "tformer.interop.load_config (on the command line: --config or --hf)")
        try:
            return cls.from_dict(data)
        except TformerError as exc:
            raise FileFormatError(f"config file {path}: {exc}", path) from None

    def replace(self, **changes: Any) -> "ModelConfig":
        return self.from_dict({**self.to_dict(), **changes})

    def with_overrides(self, assignments: list[str]) -> "ModelConfig":
        """Apply CLI-style ``key=value`` strings (values parsed as JSON when they can be)."""
        changes: dict[str, Any] = {}
        for item in assignments:
            if "=" not in item:
                raise TformerError(f"--set expects key=value, got '{item}'")
            key, raw = item.split("=", 1)
            try:
                value = json.loads(raw)
            except (ValueError, RecursionError):  # not JSON (or absurdly nested or long): the text itself
                value = raw
            changes[key.strip()] = value
        return self.replace(**changes)


def read_config_json(path: str | Path) -> dict[str, Any]:
    """The JSON object in a config file, with one-line errors for a missing, huge, binary, deeply
    nested or non-JSON file or a non-object."""
    return read_json(path, "config file", max_bytes=MAX_CONFIG_BYTES,
                     fix="pass the path of a JSON config (a preset name, a tformer or Hugging Face config.json)")


# Presets (the data: tformer.core.presets) -----------------------------------------------
def preset_names() -> list[str]:
    return list(PRESETS)


def preset(name: str, **overrides: Any) -> ModelConfig:
    """A named preset, optionally with fields replaced."""
    if name not in PRESETS:
        hint = difflib.get_close_matches(name, PRESETS, n=1)
        extra = f" (did you mean '{hint[0]}'?)" if hint else ""
        raise TformerError(f"unknown preset '{name}'{extra}; see `tformer presets` for the list")
    return ModelConfig.from_dict({**PRESETS[name], "name": name, **overrides})
