"""GGUF's architectures (a file's ``general.architecture``), one record each: what tformer's reader (gguf_config,
gguf_model) and writer (gguf_write) need to know about a family, so that neither branches on the name.

A record holds the file's tensor names against tformer's state-dict names (and, for a family the reader loads, the
Hugging Face names its weights go through), the metadata keys beyond the common ones, the Hugging Face model_type
and activation the reader produces, and which tformer configs the writer files under it. Adding a family (qwen2,
phi3, ...) is one record here plus what its model does differently; the modules that read and write stay as they
are. Torch-free: `tformer count --gguf` reads the records.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, replace
from functools import cached_property

from tformer.core.errors import TformerError

# What a gemma3 file leaves to the reader (llama.cpp fixes them for the architecture): the sliding layers' RoPE base
# and the period of global layers (every sixth).
GEMMA3_LOCAL_THETA, GEMMA3_PERIOD = 10_000.0, 6


@dataclass(frozen=True)
class GgufTensor:
    """One tensor of a GGUF file: llama.cpp's name against tformer's (a layer's names without their ``blk.{i}.``
    and ``decoder.layers.{i}.`` prefixes)."""

    gguf: str
    # tformer's state-dict names; several when llama.cpp fuses them into one tensor (gpt2's attn_qkv: Q, K and V
    # concatenated along the rows, in this order)
    ours: tuple[str, ...]
    # Hugging Face's name, which the reader's weights go through (hf.model_from_hf); None where tformer does not
    # read the family
    hf: str | None = None
    # the ModelConfig field with the head count when llama.cpp's converter reordered the rows into consecutive pairs
    # (LLaMA's Q and K: its RoPE rotates pairs where tformer and Hugging Face rotate halves), else None
    permute: str | None = None
    # a bias that llama.cpp's architecture always has: a model trained without one gets zeros (the same sums)
    zero_fill: bool = False
    # stored in the file's --type when 2-d; False keeps it F32 whatever the type (llama.cpp never quantizes gpt2's
    # position table)
    matrix: bool = True
    # reading: Hugging Face holds the matrix transposed (GPT-2's Conv1D: (in, out) where the file has (out, in))
    hf_transpose: bool = False


# The untied LM head, the same in every family; a file without it is read (by llama.cpp too) as tied.
HEAD = GgufTensor("output.weight", ("lm_head.weight",), "lm_head.weight")


@dataclass(frozen=True, eq=False)  # eq=False: hashable by identity although it holds functions
class GgufFamily:
    """One GGUF architecture, as tformer reads and writes it."""

    name: str  # general.architecture, and the prefix of the family's metadata keys
    hf_model_type: str  # the Hugging Face model_type of the same models (the config.json the reader makes)
    hidden_act: str  # that config.json's hidden_act: the activation llama.cpp computes for the family
    reads: bool  # gguf_config / gguf_model load it
    writes: bool  # gguf_write saves it
    # the tensors in llama.cpp's file order: before the layers, each layer's, after the layers (then HEAD)
    first: tuple[GgufTensor, ...]
    layer: tuple[GgufTensor, ...]
    last: tuple[GgufTensor, ...]
    # reading: llama.cpp stores each norm's whole scale (1 + w for Gemma), tformer and Hugging Face hold w
    norm_offset: float = 0.0
    # reading: where Hugging Face's layers live (model.layers.{i}. for LLaMA's kin, transformer.h.{i}. for GPT-2)
    hf_layer_prefix: str = "model.layers"
    # reading: the metadata key (under "{name}.") of the norms' epsilon
    norm_eps_key: str = "attention.layer_norm_rms_epsilon"
    # reading: (meta, config) -> None, the config.json fields beyond the common ones; meta(key, kind, low=None) reads
    # the checked metadata value "{name}.{key}"
    read_config: Callable[[Callable, dict], None] | None = None
    # writing: the ModelConfig fields (and values) that file a tformer decoder under this family; of the families a
    # config matches, the one with the most fields wins (qwen2's llama fields + qkv_bias before llama's)
    match: tuple[tuple[str, object], ...] = ()
    summary: str = ""  # writing: what the family holds, in words, for the refusals
    # writing: config -> why llama.cpp's family cannot hold it (one clause), or None
    refusal: Callable[[object], str | None] | None = None
    # writing: config -> [(key under "{name}.", value, GGUF type)], the metadata beyond the common keys
    metadata: Callable[[object], list[tuple[str, object, str]]] | None = None
    # writing: config -> caveats the export reports (a difference llama.cpp computes but tformer does not)
    notes: Callable[[object], list[str]] | None = None

    @property
    def tensors(self) -> tuple[GgufTensor, ...]:
        """Every row: the model-wide ones, each layer's, the head."""
        return (*self.first, *self.layer, *self.last, HEAD)

    @property
    def zero_biases(self) -> bool:
        """Whether the written file has biases a model trained without them gets as zeros."""
        return any(t.zero_fill for t in self.layer)

    @cached_property
    def hf_layer(self) -> dict[str, GgufTensor]:
        """Reading: a layer's GGUF names (no ``blk.{i}.``) -> their rows, for those with a Hugging Face name."""
        return {t.gguf: t for t in self.layer if t.hf}

    @cached_property
    def hf_model(self) -> dict[str, GgufTensor]:
        """Reading: the model-wide GGUF names -> their rows, for those with a Hugging Face name."""
        return {t.gguf: t for t in (*self.first, *self.last, HEAD) if t.hf}

    def expand(self, n_layers: int, head: bool = True) -> list[tuple[str, tuple[str, ...], GgufTensor]]:
        """(GGUF name, tformer names, row) of every tensor of an ``n_layers`` model, in file order."""
        out = [(t.gguf, t.ours, t) for t in self.first]
        for i in range(n_layers):
            out += [(f"blk.{i}.{t.gguf}", tuple(f"decoder.layers.{i}.{o}" for o in t.ours), t) for t in self.layer]
        out += [(t.gguf, t.ours, t) for t in self.last]
        return out + ([(HEAD.gguf, HEAD.ours, HEAD)] if head else [])


# ---------------------------------------------------------------------------------------------
# llama: RoPE, RMSNorm, SwiGLU, no biases (LLaMA, SmolLM2, a tformer llama)

_EMBED = GgufTensor("token_embd.weight", ("tok_embed.weight",), "model.embed_tokens.weight")
_FINAL_NORM = GgufTensor("output_norm.weight", ("decoder.final_norm.weight",), "model.norm.weight")


def _t(gguf: str, ours: str, hf: str | None = None, **kw) -> GgufTensor:
    """A one-to-one row (hf given as the name under Hugging Face's ``model.layers.{i}.``)."""
    return GgufTensor(gguf, (ours,), hf, **kw)


_ATTN_NORM = _t("attn_norm.weight", "attn_norm.weight", "input_layernorm.weight")
_Q = _t("attn_q.weight", "attn.q_proj.weight", "self_attn.q_proj.weight")
_K = _t("attn_k.weight", "attn.k_proj.weight", "self_attn.k_proj.weight")
_V = _t("attn_v.weight", "attn.v_proj.weight", "self_attn.v_proj.weight")
_O = _t("attn_output.weight", "attn.o_proj.weight", "self_attn.o_proj.weight")
_GATE = _t("ffn_gate.weight", "mlp.gate.weight", "mlp.gate_proj.weight")
_UP = _t("ffn_up.weight", "mlp.up.weight", "mlp.up_proj.weight")
_DOWN = _t("ffn_down.weight", "mlp.down.weight", "mlp.down_proj.weight")


def _llama_refusal(config) -> str | None:
    if config.bias:
        return ("biases (bias=True): tformer writes llama files without them (llama.cpp's optional llama biases are "
                "neither written nor checked against it yet)")
    if not (config.gated_mlp and config.activation == "silu"):
        return (f"llama.cpp's llama computes a SwiGLU MLP (silu, gated); this one is "
                f"activation='{config.activation}', gated_mlp={config.gated_mlp}")
    if config.rope_scaling not in ("none", "linear", "llama3"):
        return f"RoPE scaling '{config.rope_scaling}' is not written yet (plain, linear and llama3 are)"
    return None


def _llama_metadata(config) -> list[tuple[str, object, str]]:
    out = [("attention.head_count_kv", config.n_kv_heads, "u32"),
           ("attention.layer_norm_rms_epsilon", float(config.norm_eps), "f32"),
           ("rope.freq_base", float(config.rope_theta), "f32"),
           # llama.cpp rotates the whole head and checks that the file says so
           ("rope.dimension_count", config.head_dim, "u32")]
    if config.rope_scaling == "linear":
        out += [("rope.scaling.type", "linear", "string"), ("rope.scaling.factor", float(config.rope_factor), "f32")]
    # llama3: no key; its per-frequency divisors are the rope_freqs tensor (gguf_write)
    if config.head_dim * config.n_heads != config.d_model:  # else llama.cpp derives it
        out += [("attention.key_length", config.head_dim, "u32"), ("attention.value_length", config.head_dim, "u32")]
    return out


LLAMA = GgufFamily(
    name="llama", hf_model_type="llama", hidden_act="silu", reads=True, writes=True,
    first=(_EMBED,),
    layer=(_ATTN_NORM, replace(_Q, permute="n_heads"), replace(_K, permute="n_kv_heads"), _V, _O,
           _t("ffn_norm.weight", "mlp_norm.weight", "post_attention_layernorm.weight"), _GATE, _UP, _DOWN),
    last=(_FINAL_NORM,),
    match=(("position", "rope"), ("norm", "rmsnorm")),
    summary="RoPE + RMSNorm + SwiGLU decoder",
    refusal=_llama_refusal, metadata=_llama_metadata)


# ---------------------------------------------------------------------------------------------
# qwen2 (Qwen2, Qwen2.5) and qwen3: LLaMA's layers, rotated by halves (llama.cpp's NEOX RoPE: no Q/K permutation);
# qwen2 adds biases to q, k and v, qwen3 a per-head RMSNorm of q and k and a head_dim of its own


def _swiglu_refusal(config) -> str | None:
    if not (config.gated_mlp and config.activation == "silu"):
        return (f"llama.cpp's {'qwen3' if config.qk_norm else 'qwen2'} computes a SwiGLU MLP (silu, gated); this one "
                f"is activation='{config.activation}', gated_mlp={config.gated_mlp}")
    if config.rope_scaling != "none":
        return f"RoPE scaling '{config.rope_scaling}' is not written yet (plain RoPE only)"
    return None


def _qwen2_refusal(config) -> str | None:
    if config.bias:
        return "biases on o and the MLP (bias=True): Qwen2 has them on q, k and v alone (qkv_bias=True, bias=False)"
    if config.qk_norm:
        return "q/k norms with q/k/v biases: qwen2 has no norms there, qwen3 no biases"
    return _swiglu_refusal(config)


def _qwen3_refusal(config) -> str | None:
    if config.bias or config.qkv_has_bias:
        return "biases (bias or qkv_bias): Qwen3's layers have none"
    return _swiglu_refusal(config)


def _qwen3_metadata(config) -> list[tuple[str, object, str]]:
    """LLaMA's keys; the head width always written (Qwen3's is usually not d_model / heads)."""
    out = [m for m in _llama_metadata(config) if not m[0].startswith("attention.key_length")
           and not m[0].startswith("attention.value_length")]
    return out + [("attention.key_length", config.head_dim, "u32"), ("attention.value_length", config.head_dim, "u32")]


_FFN_NORM = _t("ffn_norm.weight", "mlp_norm.weight", "post_attention_layernorm.weight")
_QKV_BIASES = tuple(_t(f"attn_{x}.bias", f"attn.{x}_proj.bias", f"self_attn.{x}_proj.bias") for x in "qkv")

QWEN2 = GgufFamily(
    name="qwen2", hf_model_type="qwen2", hidden_act="silu", reads=True, writes=True,
    first=(_EMBED,),
    layer=(_ATTN_NORM, _Q, _QKV_BIASES[0], _K, _QKV_BIASES[1], _V, _QKV_BIASES[2], _O, _FFN_NORM, _GATE, _UP, _DOWN),
    last=(_FINAL_NORM,),
    match=(("position", "rope"), ("norm", "rmsnorm"), ("qkv_bias", True)),
    summary="llama + qkv_bias",
    refusal=_qwen2_refusal, metadata=_llama_metadata)

QWEN3 = GgufFamily(
    name="qwen3", hf_model_type="qwen3", hidden_act="silu", reads=True, writes=True,
    first=(_EMBED,),
    layer=(_ATTN_NORM, _Q, _t("attn_q_norm.weight", "attn.q_norm.weight", "self_attn.q_norm.weight"),
           _K, _t("attn_k_norm.weight", "attn.k_norm.weight", "self_attn.k_norm.weight"), _V, _O, _FFN_NORM,
           _GATE, _UP, _DOWN),
    last=(_FINAL_NORM,),
    match=(("position", "rope"), ("norm", "rmsnorm"), ("qk_norm", True)),
    summary="llama + qk_norm",
    refusal=_qwen3_refusal, metadata=_qwen3_metadata)


# ---------------------------------------------------------------------------------------------
# phi3 (Phi-3, Phi-3.5, Phi-4-mini; read only): LLaMA's layers with q/k/v fused in one tensor and gate/up in another,
# rotated by halves (no permutation). A file names Phi-3-mini-4k's window (attention.sliding_window, 2047), but
# llama.cpp computes every phi3 file with full attention (its Phi SWA is disabled: llama.cpp PR 13676) and
# transformers' GGUF loader reads no window, so tformer reads none either. Its model is then a llama model: written
# back as llama (llama.cpp computes the same), not as phi3.


def _phi3_config(meta: Callable, config: dict) -> None:
    """A refusal of what tformer does not compute: RoPE on part of each head. The window is not read (above)."""
    heads, hidden = config["num_attention_heads"], config["hidden_size"]
    head_dim = config.get("head_dim") or hidden // heads
    rotated = meta("rope.dimension_count", int, default=head_dim, low=1)
    if rotated != head_dim:
        raise TformerError(f"this phi3 file rotates {rotated} of each head's {head_dim} dimensions "
                           "(partial_rotary_factor); tformer rotates whole heads")
    config["original_max_position_embeddings"] = meta("rope.scaling.original_context_length", int,
                                                      default=config["max_position_embeddings"], low=1)


PHI3 = GgufFamily(
    name="phi3", hf_model_type="phi3", hidden_act="silu", reads=True, writes=False,
    first=(_EMBED,),
    layer=(_ATTN_NORM,
           GgufTensor("attn_qkv.weight", tuple(f"attn.{x}_proj.weight" for x in "qkv"), "self_attn.qkv_proj.weight"),
           _O, _FFN_NORM,
           GgufTensor("ffn_up.weight", ("mlp.gate.weight", "mlp.up.weight"), "mlp.gate_up_proj.weight"), _DOWN),
    last=(_FINAL_NORM,), read_config=_phi3_config)


# ---------------------------------------------------------------------------------------------
# gemma3 (read only): q/k norms, a norm before and after each sublayer (llama.cpp's "ffn_norm" is the one before the
# MLP), no Q/K permutation (its converter leaves Gemma's half-split rotation alone), norms stored as 1 + w


def _gemma3_config(meta: Callable, config: dict) -> None:
    """What a gemma3 file says beyond the common keys, and the layer pattern and local RoPE base llama.cpp fixes."""
    n = config["num_hidden_layers"]
    head_dim = meta("attention.key_length", int, low=1)
    config.update(
        head_dim=head_dim, query_pre_attn_scalar=head_dim, sliding_window=meta("attention.sliding_window", int, low=1),
        layer_types=["full_attention" if (i + 1) % GEMMA3_PERIOD == 0 else "sliding_attention" for i in range(n)],
        rope_parameters={"full_attention": {"rope_type": "default", "rope_theta": config.pop("rope_theta")},
                         "sliding_attention": {"rope_type": "default", "rope_theta": GEMMA3_LOCAL_THETA}})


GEMMA3 = GgufFamily(
    name="gemma3", hf_model_type="gemma3_text", hidden_act="gelu_pytorch_tanh", reads=True, writes=False,
    first=(_EMBED,),
    layer=(_ATTN_NORM, _Q, _t("attn_q_norm.weight", "attn.q_norm.weight", "self_attn.q_norm.weight"),
           _K, _t("attn_k_norm.weight", "attn.k_norm.weight", "self_attn.k_norm.weight"), _V, _O,
           _t("post_attention_norm.weight", "attn_post_norm.weight", "post_attention_layernorm.weight"),
           _t("ffn_norm.weight", "mlp_norm.weight", "pre_feedforward_layernorm.weight"), _GATE, _UP, _DOWN,
           _t("post_ffw_norm.weight", "mlp_post_norm.weight", "post_feedforward_layernorm.weight")),
    last=(_FINAL_NORM,),
    norm_offset=1.0, read_config=_gemma3_config)


# ---------------------------------------------------------------------------------------------
# gpt2: learned positions, LayerNorm, fused QKV, a bias on every Linear (GPT-2, char-small); read through Hugging
# Face's GPT-2 names, whose Conv1D matrices are the file's transposed


def _gpt2_refusal(config) -> str | None:
    if config.activation not in ("gelu_tanh", "gelu"):
        return (f"llama.cpp's gpt2 computes GELU; this MLP is activation='{config.activation}'"
                + (" (gated)" if config.gated_mlp else ""))
    return None


def _gpt2_notes(config) -> list[str]:
    if config.activation == "gelu":
        return [("the model's GELU is the exact (erf) one; llama.cpp's gpt2 computes the tanh approximation, which "
                 "differs from it by under 5e-4 per activation")]
    return []


def _linear(gguf: str, ours: str, hf: str) -> tuple[GgufTensor, GgufTensor]:
    return (_t(f"{gguf}.weight", f"{ours}.weight", f"{hf}.weight", hf_transpose=True),
            _t(f"{gguf}.bias", f"{ours}.bias", f"{hf}.bias", zero_fill=True))


def _norm(gguf: str, ours: str, hf: str) -> tuple[GgufTensor, GgufTensor]:
    return _t(f"{gguf}.weight", f"{ours}.weight", f"{hf}.weight"), _t(f"{gguf}.bias", f"{ours}.bias", f"{hf}.bias")


def _gpt2_config(meta: Callable, config: dict) -> None:
    """The common fields under GPT-2's config.json names (no RoPE, no key/value heads of their own, no dropout)."""
    for common, gpt2 in (("num_hidden_layers", "n_layer"), ("hidden_size", "n_embd"), ("intermediate_size", "n_inner"),
                         ("num_attention_heads", "n_head"), ("max_position_embeddings", "n_positions"),
                         ("rms_norm_eps", "layer_norm_epsilon"), ("hidden_act", "activation_function")):
        config[gpt2] = config.pop(common)
    if config.pop("num_key_value_heads") != config["n_head"]:
        raise TformerError("a gpt2 GGUF file with attention.head_count_kv other than head_count is damaged")
    del config["rope_theta"]
    config.update(n_ctx=config["n_positions"], resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0)


GPT2 = GgufFamily(
    name="gpt2", hf_model_type="gpt2", hidden_act="gelu_new", reads=True, writes=True,
    # llama.cpp never quantizes the position table (its converter keeps it F32, its quantizer skips it)
    first=(GgufTensor("token_embd.weight", ("tok_embed.weight",), "transformer.wte.weight"),
           GgufTensor("position_embd.weight", ("decoder.positions.weight",), "transformer.wpe.weight", matrix=False)),
    layer=(*_norm("attn_norm", "attn_norm", "ln_1"),
           GgufTensor("attn_qkv.weight", tuple(f"attn.{x}_proj.weight" for x in "qkv"), "attn.c_attn.weight",
                      hf_transpose=True),
           GgufTensor("attn_qkv.bias", tuple(f"attn.{x}_proj.bias" for x in "qkv"), "attn.c_attn.bias",
                      zero_fill=True),
           *_linear("attn_output", "attn.o_proj", "attn.c_proj"), *_norm("ffn_norm", "mlp_norm", "ln_2"),
           *_linear("ffn_up", "mlp.up", "mlp.c_fc"), *_linear("ffn_down", "mlp.down", "mlp.c_proj")),
    last=_norm("output_norm", "decoder.final_norm", "transformer.ln_f"),
    hf_layer_prefix="transformer.h", norm_eps_key="attention.layer_norm_epsilon", read_config=_gpt2_config,
    match=(("position", "learned"), ("norm", "layernorm")),
    summary="learned positions + LayerNorm decoder",
    refusal=_gpt2_refusal, metadata=lambda c: [("attention.layer_norm_epsilon", float(c.norm_eps), "f32")],
    notes=_gpt2_notes)


FAMILIES = (LLAMA, QWEN2, QWEN3, PHI3, GEMMA3, GPT2)
_BY_NAME = {f.name: f for f in FAMILIES}
READS = tuple(f.name for f in FAMILIES if f.reads)  # general.architecture values tformer reads
WRITES = tuple(f.name for f in FAMILIES if f.writes)  # and writes
_WRITTEN = [f"{f.name} ({f.summary})" for f in FAMILIES if f.writes]
EXPORTS = "tformer writes GGUF for " + ", ".join(_WRITTEN[:-1]) + " and " + _WRITTEN[-1]


def gguf_family(name: object, purpose: str = "reads", where: str = "the GGUF file") -> GgufFamily:
    """The record of the architecture ``name`` that tformer ``purpose`` ("reads" or "writes"), or a one-line
    TformerError naming those it does (``where``: the file, in the message)."""
    if purpose not in ("reads", "writes"):
        raise ValueError(f"purpose must be 'reads' or 'writes', not {purpose!r}")
    family = _BY_NAME.get(name) if isinstance(name, str) else None
    if family is None or not getattr(family, purpose):
        shown = name if isinstance(name, str) and len(name) < 40 else type(name).__name__
        supported = READS if purpose == "reads" else WRITES
        raise TformerError(f"{where} holds a '{shown}' model; tformer {purpose}: {', '.join(supported)}")
    return family


def export_refusal(config, what: str) -> TformerError:
    """Why ``config`` cannot be written as GGUF, in one line naming what tformer writes."""
    return TformerError(f"cannot export {config.name} as GGUF: {what}; {EXPORTS}")


def family_for_config(config) -> GgufFamily:
    """The family a tformer decoder's config is written as (by the fields in each writing family's ``match``), or
    the refusal naming them. Only the match: gguf_write.gguf_architecture checks the rest (a decoder, no task head,
    the attention kind, the family's own refusal)."""
    # the most specific match first: qwen2 (llama's fields + qkv_bias) and qwen3 (+ qk_norm) before llama
    writers = sorted((f for f in FAMILIES if f.writes), key=lambda f: -len(f.match))
    for family in writers:
        if all(getattr(config, k) == v for k, v in family.match):
            return family
    # named by the families the others refine (llama, gpt2): a config none matches differs from those first
    base = [f for f in writers if not any(set(g.match) < set(f.match) for g in writers)]
    fields = list(dict.fromkeys(k for f in base for k, _ in f.match))
    have = " with ".join(f"{k}='{getattr(config, k)}'" for k in fields)
    wanted = " nor ".join(f"{f.name}'s ({' + '.join(str(v) for _, v in f.match)})" for f in base)
    raise export_refusal(config, f"{have} is neither {wanted}")


__all__ = ["EXPORTS", "FAMILIES", "GEMMA3", "GPT2", "HEAD", "LLAMA", "PHI3", "QWEN2", "QWEN3", "READS", "WRITES",
           "GgufFamily", "GgufTensor",
           "export_refusal", "family_for_config", "gguf_family"]
