"""Hugging Face ``config.json`` <-> ModelConfig.

Each supported ``model_type`` reads into one ModelConfig; anything in the file that our model
cannot reproduce exactly raises, so a loaded checkpoint never silently computes something else.
Writing goes the other way and is checked by reading the result back: a config that no HF family
can express raises instead of producing a file that loads as a different model.
"""

from __future__ import annotations

import math
import warnings
from typing import Any

from tformer.core.config import ModelConfig
from tformer.core.errors import TformerError
from tformer.core.files import described
from tformer.interop.hf_fields import ACTIVATION_OUT as _ACTIVATION_OUT
from tformer.interop.hf_fields import activation as _activation
from tformer.interop.hf_fields import checked_config
from tformer.interop.hf_fields import dropouts as _dropouts
from tformer.interop.hf_fields import refuse as _refuse
from tformer.interop.hf_fields import token_id as _token_id
from tformer.interop import hf_gemma
from tformer.interop.hf_heads import head_config_out, head_fields, head_from_file
from tformer.interop.hf_vision import VISION_FROM_WEIGHTS, VISION_HF_FAMILIES, VISION_READERS, VISION_WRITERS

SUPPORTED = ("gpt2", "llama", "mistral", "qwen2", "qwen3", "phi3", hf_gemma.MODEL_TYPE, "bert", "bart", "t5", "roberta", "distilbert", "albert", *VISION_READERS)

# Training-only settings: they never change eval outputs, so a value HF cannot hold is warned
# about rather than refused.
_DROPOUT_FIELDS = ("dropout", "attention_dropout", "activation_dropout")
# Fields compared through the size they stand for: None and an explicit default mean the same.
_IGNORED = ("name", "attn_impl") + _DROPOUT_FIELDS


# Reading ----------------------------------------------------------------------------------
def is_hf_config(d: dict) -> bool:
    """Whether a parsed config.json is Hugging Face's (every HF config names its model_type) rather than tformer's."""
    return "model_type" in d


def config_from_hf(d: dict) -> ModelConfig:
    """A ModelConfig equivalent to a Hugging Face config.json (as a dict)."""
    model_type = d.get("model_type")
    if not isinstance(model_type, str) or model_type not in _READERS:
        shown = f"'{model_type}'" if isinstance(model_type, str) and len(model_type) <= 40 else described(model_type)
        raise TformerError(f"Hugging Face model_type {shown} is not supported; supported: {', '.join(SUPPORTED)}")
    d = checked_config(d, model_type)
    try:
        fields = _READERS[model_type](d) | head_fields(d)
    except KeyError as exc:
        raise TformerError(f"{model_type} config.json lacks the required key {exc}; is the file complete?") from None
    fields["name"] = d.get("_name_or_path") or f"hf-{model_type}"
    return ModelConfig.from_dict(fields)


def _gpt2(d: dict) -> dict:
    if d.get("scale_attn_by_inverse_layer_idx"):
        _refuse("gpt2", "scale_attn_by_inverse_layer_idx=true")
    if d.get("add_cross_attention"):
        _refuse("gpt2", "add_cross_attention=true")
    if d.get("scale_attn_weights") is False:
        _refuse("gpt2", "scale_attn_weights=false")
    n_embd = d["n_embd"]
    return dict(
        arch="decoder", n_layers=d["n_layer"], d_model=n_embd, n_heads=d["n_head"],
        d_ff=d.get("n_inner") or 4 * n_embd, vocab_size=d["vocab_size"], max_positions=d["n_positions"],
        position="learned", norm="layernorm", norm_placement="pre", norm_eps=d.get("layer_norm_epsilon", 1e-5),
        final_norm=True, activation=_activation(d.get("activation_function", "gelu_new"), "gpt2"),
        bias=True, tied_embeddings=d.get("tie_word_embeddings", True) is not False,
        pad_token_id=_token_id(d, "pad_token_id"), bos_token_id=_token_id(d, "bos_token_id"),
        eos_token_id=_token_id(d, "eos_token_id"),
        **_dropouts("gpt2", dropout=[d.get("resid_pdrop", 0.1), d.get("embd_pdrop", 0.1)],
                    attention_dropout=d.get("attn_pdrop", 0.1), activation_dropout=0.0),
    )


# HF rope_type -> our rope_scaling. longrope (Phi-3's 128k) reshapes frequencies in ways our model does not.
_ROPE_TYPES = {"default": "none", "linear": "linear", "dynamic": "dynamic", "yarn": "yarn", "llama3": "llama3"}
_ROPE_TYPES_OUT = {ours: hf for hf, ours in _ROPE_TYPES.items()}


def _rope(d: dict) -> dict:
    """Our rope_* fields from HF's rope_parameters (transformers >= 5) or rope_scaling (older files)."""
    mt = d["model_type"]
    params = d.get("rope_parameters") or {}
    spec = d.get("rope_scaling") or params  # HF reads rope_scaling first when a file has both
    kind = spec.get("rope_type") or spec.get("type") or "default"
    if kind not in _ROPE_TYPES:
        _refuse(mt, f"rope_type='{kind}' (RoPE scaling; tformer reproduces {', '.join(_ROPE_TYPES)})")
    theta = spec.get("rope_theta", params.get("rope_theta", d.get("rope_theta", 10000.0)))
    out = dict(rope_theta=float(theta), rope_scaling=_ROPE_TYPES[kind])
    if kind in ("linear", "dynamic"):  # dynamic counts from max_position_embeddings: our default
        if spec.get("factor") is None:
            raise TformerError(f"{mt} rope_scaling of rope_type '{kind}' has no factor; is the file complete?")
        out["rope_factor"] = float(spec["factor"])
    elif kind == "llama3":
        missing = [k for k in ("factor", "original_max_position_embeddings") if spec.get(k) is None]
        if missing:
            raise TformerError(f"{mt} rope_scaling of rope_type 'llama3' has no {' or '.join(missing)}; is the file "
                               "complete?")
        out.update(rope_factor=float(spec["factor"]),
                   rope_original_positions=int(spec["original_max_position_embeddings"]),
                   rope_low_freq_factor=float(spec.get("low_freq_factor", 1.0)),
                   rope_high_freq_factor=float(spec.get("high_freq_factor", 4.0)))
    elif kind == "yarn":
        if spec.get("truncate", True) is False:
            _refuse(mt, "rope_scaling truncate=false (YaRN with an unrounded ramp)")
        # Phi-3 style files keep the trained length beside rope_scaling; HF prefers that copy.
        original = d.get("original_max_position_embeddings") or spec.get("original_max_position_embeddings")
        longest = d.get("max_position_embeddings", 2048)
        factor = spec.get("factor") or longest / (original or longest)
        attention = spec.get("attention_factor")
        mscale, mscale_all = spec.get("mscale"), spec.get("mscale_all_dim")
        if attention is None and mscale and mscale_all:  # DeepSeek's ratio of two scales, fixed here
            attention = (0.1 * mscale * math.log(factor) + 1) / (0.1 * mscale_all * math.log(factor) + 1)
        out.update(rope_factor=float(factor), rope_original_positions=original,
                   rope_beta_fast=float(spec.get("beta_fast") or 32.0),
                   rope_beta_slow=float(spec.get("beta_slow") or 1.0),
                   rope_attention_factor=None if attention is None else float(attention))
    return out


def _rope_out(c: ModelConfig) -> dict:
    """HF's rope_parameters (and rope_scaling, which transformers < 5 reads) for ``c``."""
    if c.rope_scaling not in _ROPE_TYPES_OUT:
        raise TformerError(f"rope_scaling='{c.rope_scaling}' has no Hugging Face rope_type; save with "
                           f"rope_scaling 'dynamic' or 'yarn' instead, or keep tformer's own checkpoint format")
    spec: dict[str, Any] = {"rope_type": _ROPE_TYPES_OUT[c.rope_scaling]}
    if c.rope_scaling != "none":
        spec["factor"] = c.rope_factor
    if c.rope_scaling == "llama3":
        spec.update(low_freq_factor=c.rope_low_freq_factor, high_freq_factor=c.rope_high_freq_factor,
                    original_max_position_embeddings=c.rope_original_positions or c.max_positions)
    if c.rope_scaling == "yarn":
        spec.update(beta_fast=c.rope_beta_fast, beta_slow=c.rope_beta_slow)
        if c.rope_original_positions is not None:
            spec["original_max_position_embeddings"] = c.rope_original_positions
        if c.rope_attention_factor is not None:
            spec["attention_factor"] = c.rope_attention_factor
    out = dict(rope_theta=c.rope_theta, rope_parameters={**spec, "rope_theta": c.rope_theta})
    return out | ({"rope_scaling": spec} if c.rope_scaling != "none" else {})


def _same_rope(back: ModelConfig, c: ModelConfig) -> ModelConfig:
    """rope_original_positions as ours when the file computes the same: it is unused by linear scaling,
    and HF's dynamic always counts from max_position_embeddings, our default."""
    if c.rope_scaling == "linear" or (c.rope_original_positions or c.max_positions) == (
            back.rope_original_positions or back.max_positions):
        return back.replace(rope_original_positions=c.rope_original_positions)
    return back


def _llama(d: dict) -> dict:
    mt = d["model_type"]
    attn_bias, mlp_bias = bool(d.get("attention_bias", False)), bool(d.get("mlp_bias", False))
    if mt == "mistral":  # HF's Mistral layers have no bias, whatever the file says
        attn_bias = mlp_bias = False
    if attn_bias != mlp_bias:
        _refuse(mt, f"attention_bias={attn_bias} but mlp_bias={mlp_bias} (tformer has one bias switch)")
    # Mistral's window (HF's default 4096 when the file names none; null = full attention) is our
    # "sliding" kind, the same keys i - w < j <= i; Llama has no window, so one in its file is refused.
    window = d.get("sliding_window", 4096) if mt == "mistral" else d.get("sliding_window")
    if window is not None and mt != "mistral":
        _refuse(mt, f"sliding_window={window}")
    attention = dict(attn_impl="sliding", attn_window=int(window)) if window is not None else {}
    hidden, heads = d["hidden_size"], d["num_attention_heads"]
    head_dim = d.get("head_dim")
    return dict(
        arch="decoder", n_layers=d["num_hidden_layers"], d_model=hidden, n_heads=heads,
        n_kv_heads=d.get("num_key_value_heads") or heads,
        head_dim=head_dim if head_dim and head_dim * heads != hidden else None,
        d_ff=d["intermediate_size"], vocab_size=d["vocab_size"], max_positions=d.get("max_position_embeddings", 2048),
        position="rope", **_rope(d), norm="rmsnorm", norm_placement="pre",
        norm_eps=d.get("rms_norm_eps", 1e-6), final_norm=True,
        activation=_activation(d.get("hidden_act", "silu"), mt), gated_mlp=True, bias=attn_bias,
        tied_embeddings=bool(d.get("tie_word_embeddings", False)),
        pad_token_id=_token_id(d, "pad_token_id"), bos_token_id=_token_id(d, "bos_token_id"),
        eos_token_id=_token_id(d, "eos_token_id"),
        **_dropouts(mt, dropout=0.0, attention_dropout=d.get("attention_dropout", 0.0), activation_dropout=0.0),
        **attention,
    )


def _qwen(d: dict) -> dict:
    """Qwen2 / Qwen2.5 (biases on q, k and v alone) and Qwen3 (no biases; an RMSNorm over each head's query and key
    before RoPE): LLaMA's layers otherwise. Their files name a window that is off unless use_sliding_window is set."""
    mt = d["model_type"]
    if d.get("use_sliding_window"):
        _refuse(mt, "use_sliding_window=true (Qwen's windows on the upper layers only)")
    if mt == "qwen3" and d.get("attention_bias"):
        _refuse(mt, "attention_bias=true (biases on q, k, v and o without the MLP's)")
    fields = _llama({**d, "sliding_window": None, "attention_bias": False, "mlp_bias": False})
    if mt == "qwen2":
        return fields | dict(qkv_bias=True)
    return fields | dict(qk_norm=True)


def _phi3(d: dict) -> dict:
    """Phi-3 / Phi-3.5 / Phi-4-mini: LLaMA's layers (fused q/k/v and gate/up tensors, split when the weights are read),
    a window on every layer when the file names one (Phi-3-mini-4k: 2047), as Mistral's."""
    params = {**(d.get("rope_parameters") or {}), **(d.get("rope_scaling") or {})}
    rotary = params.get("partial_rotary_factor", d.get("partial_rotary_factor", 1.0))
    if rotary != 1.0:
        _refuse("phi3", f"partial_rotary_factor={rotary} (RoPE on part of each head)")
    window = d.get("sliding_window")
    fields = _llama({**d, "sliding_window": None, "attention_bias": False, "mlp_bias": False})
    fields.update(_dropouts("phi3", dropout=[d.get("resid_pdrop", 0.0), d.get("embd_pdrop", 0.0)],
                            attention_dropout=d.get("attention_dropout", 0.0), activation_dropout=0.0))
    return fields | (dict(attn_impl="sliding", attn_window=int(window)) if window else {})


def _bert(d: dict) -> dict:
    if d.get("position_embedding_type", "absolute") != "absolute":
        _refuse("bert", f"position_embedding_type='{d['position_embedding_type']}'")
    if d.get("is_decoder") or d.get("add_cross_attention"):
        _refuse("bert", "is_decoder/add_cross_attention (a BERT decoder)")
    # Refined from the weights when loading: a BertModel has a pooler, a BertForMaskedLM an MLM head.
    archs = d.get("architectures") or ["BertModel"]
    mlm = any(a in ("BertForMaskedLM", "BertForPreTraining") for a in archs)
    return dict(
        arch="encoder", n_layers=d["num_hidden_layers"], d_model=d["hidden_size"], n_heads=d["num_attention_heads"],
        d_ff=d["intermediate_size"], vocab_size=d["vocab_size"], max_positions=d.get("max_position_embeddings", 512),
        position="learned", norm="layernorm", norm_placement="post", norm_eps=d.get("layer_norm_eps", 1e-12),
        final_norm=False, embedding_norm=True, activation=_activation(d.get("hidden_act", "gelu"), "bert"),
        bias=True, type_vocab_size=d.get("type_vocab_size", 2), pooler=not mlm or "BertForPreTraining" in archs,
        lm_head=mlm, tied_embeddings=d.get("tie_word_embeddings", True) is not False,
        pair_head="BertForPreTraining" in archs,  # NSP: cls.seq_relationship on the pooler
        pad_token_id=_token_id(d, "pad_token_id", 0), bos_token_id=_token_id(d, "bos_token_id"),
        eos_token_id=_token_id(d, "eos_token_id"),
        **_dropouts("bert", dropout=d.get("hidden_dropout_prob", 0.1),
                    attention_dropout=d.get("attention_probs_dropout_prob", 0.1), activation_dropout=0.0),
    )


def _bart(d: dict) -> dict:
    for key in ("normalize_before", "add_final_layer_norm", "add_bias_logits", "static_position_embeddings"):
        if d.get(key):
            _refuse("bart", f"{key}=true")
    if d.get("normalize_embedding") is False:
        _refuse("bart", "normalize_embedding=false")
    for a, b in (("encoder_attention_heads", "decoder_attention_heads"), ("encoder_ffn_dim", "decoder_ffn_dim")):
        if d[a] != d[b]:
            _refuse("bart", f"{a}={d[a]} but {b}={d[b]} (tformer uses one value for both stacks)")
    return dict(
        arch="encoder-decoder", n_layers=d["encoder_layers"], n_decoder_layers=d["decoder_layers"],
        d_model=d["d_model"], n_heads=d["encoder_attention_heads"], d_ff=d["encoder_ffn_dim"],
        vocab_size=d["vocab_size"], max_positions=d["max_position_embeddings"], position="learned",
        position_offset=2, norm="layernorm", norm_placement="post", norm_eps=1e-5,  # BART's LayerNorm default
        final_norm=False, embedding_norm=True, activation=_activation(d.get("activation_function", "gelu"), "bart"),
        bias=True, tied_embeddings=d.get("tie_word_embeddings", True) is not False,
        scale_embeddings=bool(d.get("scale_embedding", False)), final_logits_bias=True,
        pad_token_id=_token_id(d, "pad_token_id", 1), bos_token_id=_token_id(d, "bos_token_id", 0),
        eos_token_id=_token_id(d, "eos_token_id", 2), decoder_start_token_id=_token_id(d, "decoder_start_token_id", 2),
        **_dropouts("bart", dropout=d.get("dropout", 0.1), attention_dropout=d.get("attention_dropout", 0.0),
                    activation_dropout=d.get("activation_dropout", 0.0)),
    )


def _t5(d: dict) -> dict:
    proj = d.get("feed_forward_proj", "relu")
    parts = proj.split("-")
    gated = parts[0] == "gated" and len(parts) == 2
    if len(parts) > 2 or (len(parts) == 2 and not gated):
        _refuse("t5", f"feed_forward_proj='{proj}'")
    act = parts[-1]
    if proj == "gated-gelu":  # HF's historical alias: T5 v1.1 uses the tanh approximation here
        act = "gelu_new"
    # T5 v1.0 ties the head and scales the decoder output by d_model**-0.5; v1.1 does neither.
    # transformers >= 5 records the scaling separately and always writes tie_word_embeddings=true;
    # whether the head is really tied is then read from the weights (tformer.interop.hf).
    tied = d.get("tie_word_embeddings", True) is not False
    rescale = bool(d["scale_decoder_outputs"]) if "scale_decoder_outputs" in d else tied
    pad = _token_id(d, "pad_token_id", 0)
    rate = d.get("dropout_rate", 0.1)
    return dict(
        arch="encoder-decoder", n_layers=d["num_layers"],
        n_decoder_layers=d.get("num_decoder_layers") or d["num_layers"],
        d_model=d["d_model"], n_heads=d["num_heads"], head_dim=d["d_kv"], d_ff=d["d_ff"],
        vocab_size=d["vocab_size"], max_positions=d.get("n_positions", 512), position="relative",
        relative_attention_num_buckets=d.get("relative_attention_num_buckets", 32),
        relative_attention_max_distance=d.get("relative_attention_max_distance", 128),
        norm="rmsnorm", norm_placement="pre", norm_eps=d.get("layer_norm_epsilon", 1e-6), final_norm=True,
        activation=_activation(act, "t5"), gated_mlp=gated, bias=False, tied_embeddings=tied,
        rescale_tied_head=rescale, scale_attention=False,
        pad_token_id=pad, eos_token_id=_token_id(d, "eos_token_id", 1), bos_token_id=_token_id(d, "bos_token_id"),
        decoder_start_token_id=_token_id(d, "decoder_start_token_id", pad),
        dropout=float(rate), attention_dropout=float(rate), activation_dropout=float(rate),
    )


def _roberta(d: dict) -> dict:
    """BERT's layout; position ids start after pad_token_id (fairseq), so the table holds pad + 1 extra rows."""
    if d.get("hidden_act", "gelu") != "gelu":
        _refuse("roberta", f"hidden_act='{d['hidden_act']}' (RobertaLMHead always applies exact GELU)")
    pad = _token_id(d, "pad_token_id", 1)
    rows = d.get("max_position_embeddings", 512)
    if pad is None or rows <= pad + 1:
        _refuse("roberta", f"max_position_embeddings={rows} with pad_token_id={pad} (no room for a position)")
    return _bert(d) | dict(max_positions=rows - pad - 1, position_offset=pad + 1, pad_token_id=pad,
                           bos_token_id=_token_id(d, "bos_token_id", 0),
                           eos_token_id=_token_id(d, "eos_token_id", 2))


def _distilbert(d: dict) -> dict:
    # A sinusoidal table (sinusoidal_pos_embds) is stored in the weights like a learned one: read as learned.
    archs = d.get("architectures") or ["DistilBertModel"]
    return dict(
        arch="encoder", n_layers=d["n_layers"], d_model=d["dim"], n_heads=d["n_heads"], d_ff=d["hidden_dim"],
        vocab_size=d["vocab_size"], max_positions=d.get("max_position_embeddings", 512), position="learned",
        norm="layernorm", norm_placement="post", norm_eps=1e-12, final_norm=False, embedding_norm=True,
        activation=_activation(d.get("activation", "gelu"), "distilbert"), bias=True, type_vocab_size=0,
        pooler=False, lm_head="DistilBertForMaskedLM" in archs,
        tied_embeddings=d.get("tie_word_embeddings", True) is not False,
        pad_token_id=_token_id(d, "pad_token_id", 0), bos_token_id=_token_id(d, "bos_token_id"),
        eos_token_id=_token_id(d, "eos_token_id"),
        **_dropouts("distilbert", dropout=d.get("dropout", 0.1), attention_dropout=d.get("attention_dropout", 0.1),
                    activation_dropout=0.0),
    )


def _albert(d: dict) -> dict:
    layers, groups = d["num_hidden_layers"], d.get("num_hidden_groups", 1)
    if d.get("inner_group_num", 1) != 1:
        _refuse("albert", f"inner_group_num={d['inner_group_num']} (tformer shares one layer or none)")
    if groups not in (1, layers):
        _refuse("albert", f"num_hidden_groups={groups} (tformer shares one layer across all {layers}, or none)")
    archs = d.get("architectures") or ["AlbertModel"]
    return dict(
        arch="encoder", n_layers=layers, d_model=d["hidden_size"], n_heads=d["num_attention_heads"],
        d_ff=d["intermediate_size"], vocab_size=d["vocab_size"], max_positions=d.get("max_position_embeddings", 512),
        embed_dim=d.get("embedding_size", 128), share_layers=groups == 1 and layers > 1,
        position="learned", norm="layernorm", norm_placement="post", norm_eps=d.get("layer_norm_eps", 1e-12),
        final_norm=False, embedding_norm=True, activation=_activation(d.get("hidden_act", "gelu_new"), "albert"),
        bias=True, type_vocab_size=d.get("type_vocab_size", 2),
        pooler="AlbertForMaskedLM" not in archs, lm_head="AlbertModel" not in archs,
        pair_head="AlbertForPreTraining" in archs, tied_embeddings=d.get("tie_word_embeddings", True) is not False,
        pad_token_id=_token_id(d, "pad_token_id", 0), bos_token_id=_token_id(d, "bos_token_id", 2),
        eos_token_id=_token_id(d, "eos_token_id", 3),
        **_dropouts("albert", dropout=d.get("hidden_dropout_prob", 0.0),
                    attention_dropout=d.get("attention_probs_dropout_prob", 0.0), activation_dropout=0.0),
    )


_READERS = {"gpt2": _gpt2, "llama": _llama, "mistral": _llama, "qwen2": _qwen, "qwen3": _qwen, "phi3": _phi3,
            hf_gemma.MODEL_TYPE: lambda d: hf_gemma.read(d, _rope),
            "bert": _bert, "bart": _bart, "t5": _t5,
            "roberta": _roberta, "distilbert": _distilbert, "albert": _albert, **VISION_READERS}


# Writing ----------------------------------------------------------------------------------
def _is_set(value: Any) -> bool:
    return value is not None


# Which Hugging Face family saves a config, per architecture: the first entry whose required
# field values the config has (a callable: a test of the value). Adding an architecture or a family
# is one entry here plus its writer below (and its reader above).
HF_FAMILIES: dict[str, tuple[tuple[dict[str, Any], str, str], ...]] = {
    "decoder": (({"position": "learned", "norm": "layernorm"}, "gpt2", "GPT2LMHeadModel"),
                hf_gemma.FAMILY,
                ({"position": "rope", "norm": "rmsnorm", "attn_impl": "sliding"}, "mistral", "MistralForCausalLM"),
                ({"position": "rope", "norm": "rmsnorm", "qk_norm": True}, "qwen3", "Qwen3ForCausalLM"),
                ({"position": "rope", "norm": "rmsnorm", "qkv_bias": True}, "qwen2", "Qwen2ForCausalLM"),
                ({"position": "rope", "norm": "rmsnorm"}, "llama", "LlamaForCausalLM")),
    "encoder": (({"embed_dim": _is_set, "pair_head": True}, "albert", "AlbertForPreTraining"),
                ({"embed_dim": _is_set, "lm_head": True}, "albert", "AlbertForMaskedLM"),
                ({"embed_dim": _is_set}, "albert", "AlbertModel"),
                ({"position_offset": bool, "lm_head": True}, "roberta", "RobertaForMaskedLM"),
                ({"position_offset": bool}, "roberta", "RobertaModel"),
                ({"type_vocab_size": 0, "pooler": False, "norm_eps": 1e-12, "lm_head": True}, "distilbert",
                 "DistilBertForMaskedLM"),
                ({"type_vocab_size": 0, "pooler": False, "norm_eps": 1e-12}, "distilbert", "DistilBertModel"),
                ({"pair_head": True}, "bert", "BertForPreTraining"),
                ({"lm_head": True}, "bert", "BertForMaskedLM"),
                ({"lm_head": False}, "bert", "BertModel")),
    "encoder-decoder": (({"position": "learned"}, "bart", "BartForConditionalGeneration"),
                        ({"position": "relative"}, "t5", "T5ForConditionalGeneration")),
    "rnn": (),  # transformers has no recurrent language model
    "rnn-seq2seq": (),  # nor a recurrent encoder-decoder
    **VISION_HF_FAMILIES,  # vit: ViTForImageClassification or ViTModel; clip: CLIPModel
}


def hf_family(config: ModelConfig) -> tuple[str, str]:
    """(model_type, architecture class) that ``config`` would be saved as."""
    if not HF_FAMILIES.get(config.arch, True):
        raise TformerError(f"{config.traits.label} has no Hugging Face counterpart; keep it as a tformer checkpoint "
                           "(the training output folder: config.json + model.safetensors)")
    for requires, model_type, architecture in HF_FAMILIES.get(config.arch, ()):
        if all(v(getattr(config, k)) if callable(v) else getattr(config, k) == v for k, v in requires.items()):
            return model_type, architecture
    raise TformerError(
        f"no Hugging Face family matches this {config.arch} with position='{config.position}' and "
        f"norm='{config.norm}'; save_hf writes GPT-2 (learned+layernorm decoder), LLaMA (rope+rmsnorm decoder), "
        "Mistral (LLaMA with attn_impl='sliding'), Qwen2 (LLaMA with qkv_bias), Qwen3 (LLaMA with qk_norm), Gemma 3 (rope + rmsnorm_offset, sandwich norms, qk_norm), "
        "BERT (encoder), BART (learned encoder-decoder), T5 (relative encoder-decoder), ViT or CLIP"
    )


def _gpt2_out(c: ModelConfig) -> dict:
    return dict(n_layer=c.n_layers, n_embd=c.d_model, n_head=c.n_heads, n_inner=c.d_ff, vocab_size=c.vocab_size,
                n_positions=c.max_positions, layer_norm_epsilon=c.norm_eps,
                activation_function=_ACTIVATION_OUT[c.activation], resid_pdrop=c.dropout, embd_pdrop=c.dropout,
                attn_pdrop=c.attention_dropout, tie_word_embeddings=c.tied_embeddings)


def _llama_out(c: ModelConfig) -> dict:
    return dict(num_hidden_layers=c.n_layers, hidden_size=c.d_model, num_attention_heads=c.n_heads,
                num_key_value_heads=c.n_kv_heads, head_dim=c.head_dim, intermediate_size=c.d_ff,
                vocab_size=c.vocab_size, max_position_embeddings=c.max_positions,
                **_rope_out(c), rms_norm_eps=c.norm_eps, hidden_act=_ACTIVATION_OUT[c.activation],
                attention_bias=c.bias, mlp_bias=c.bias, attention_dropout=c.attention_dropout, tie_word_embeddings=c.tied_embeddings)


def _bert_out(c: ModelConfig) -> dict:
    return dict(num_hidden_layers=c.n_layers, hidden_size=c.d_model, num_attention_heads=c.n_heads,
                intermediate_size=c.d_ff, vocab_size=c.vocab_size, max_position_embeddings=c.max_positions,
                # BERT always adds a segment embedding; a single zero row adds nothing
                type_vocab_size=c.type_vocab_size or 1, layer_norm_eps=c.norm_eps,
                hidden_act=_ACTIVATION_OUT[c.activation], hidden_dropout_prob=c.dropout,
                attention_probs_dropout_prob=c.attention_dropout, position_embedding_type="absolute",
                tie_word_embeddings=c.tied_embeddings)


def _bart_out(c: ModelConfig) -> dict:
    return dict(encoder_layers=c.n_layers, decoder_layers=c.n_decoder_layers, d_model=c.d_model,
                encoder_attention_heads=c.n_heads, decoder_attention_heads=c.n_heads, encoder_ffn_dim=c.d_ff,
                decoder_ffn_dim=c.d_ff, vocab_size=c.vocab_size, max_position_embeddings=c.max_positions,
                activation_function=_ACTIVATION_OUT[c.activation], scale_embedding=c.scale_embeddings,
                dropout=c.dropout, attention_dropout=c.attention_dropout, activation_dropout=c.activation_dropout,
                tie_word_embeddings=c.tied_embeddings, decoder_start_token_id=c.decoder_start_token_id,
                is_encoder_decoder=True)


def _t5_out(c: ModelConfig) -> dict:
    act = _ACTIVATION_OUT[c.activation]
    if c.gated_mlp and act == "gelu_new":
        proj = "gated-gelu"  # HF reads gated-gelu as the tanh form
    elif c.gated_mlp and act == "gelu":
        raise TformerError("T5 cannot express a gated MLP with exact GELU (its 'gated-gelu' is the tanh form); "
                           "use activation=gelu_tanh")
    else:
        proj = f"gated-{act}" if c.gated_mlp else act
    rate = max(c.dropout, c.attention_dropout, c.activation_dropout)
    return dict(num_layers=c.n_layers, num_decoder_layers=c.n_decoder_layers, d_model=c.d_model, num_heads=c.n_heads,
                d_kv=c.head_dim, d_ff=c.d_ff, vocab_size=c.vocab_size, n_positions=c.max_positions,
                relative_attention_num_buckets=c.relative_attention_num_buckets,
                relative_attention_max_distance=c.relative_attention_max_distance,
                layer_norm_epsilon=c.norm_eps, feed_forward_proj=proj, dropout_rate=rate,
                # HF reads tie_word_embeddings as "scale the decoder output"; whether the head is
                # tied shows in the weights (a separate lm_head.weight or not).
                tie_word_embeddings=c.rescale_tied_head, scale_decoder_outputs=c.rescale_tied_head,
                decoder_start_token_id=c.decoder_start_token_id, is_encoder_decoder=True)


def _mistral_out(c: ModelConfig) -> dict:
    # Mistral has no bias switches (a biased model fails the read-back: it would load without them).
    out = {k: v for k, v in _llama_out(c).items() if k not in ("attention_bias", "mlp_bias")}
    return {**out, "sliding_window": c.attn_window}


def _qwen_out(c: ModelConfig) -> dict:
    # Qwen has no bias switches: Qwen2 always biases q, k and v, Qwen3 never (attention_bias stays false); a model
    # that differs fails the read-back.
    out = {k: v for k, v in _llama_out(c).items() if k not in ("attention_bias", "mlp_bias")}
    return {**out, "use_sliding_window": False, "sliding_window": None}


def _roberta_out(c: ModelConfig) -> dict:
    return _bert_out(c) | dict(max_position_embeddings=c.max_positions + c.position_offset)


def _distilbert_out(c: ModelConfig) -> dict:
    return dict(n_layers=c.n_layers, dim=c.d_model, n_heads=c.n_heads, hidden_dim=c.d_ff, vocab_size=c.vocab_size,
                max_position_embeddings=c.max_positions, activation=_ACTIVATION_OUT[c.activation],
                dropout=c.dropout, attention_dropout=c.attention_dropout, sinusoidal_pos_embds=False,
                tie_word_embeddings=c.tied_embeddings)


def _albert_out(c: ModelConfig) -> dict:
    return _bert_out(c) | dict(embedding_size=c.embed_dim, num_hidden_groups=1 if c.share_layers else c.n_layers,
                               inner_group_num=1)


_WRITERS = {"gpt2": _gpt2_out, "llama": _llama_out, "mistral": _mistral_out, "qwen2": _qwen_out, "qwen3": _qwen_out,
            hf_gemma.MODEL_TYPE: lambda c: hf_gemma.write(c, _rope_out, _ACTIVATION_OUT), "bert": _bert_out,
            "bart": _bart_out,
            "t5": _t5_out, "roberta": _roberta_out, "distilbert": _distilbert_out, "albert": _albert_out,
            **VISION_WRITERS}

# What the config file cannot hold but the tensors do, copied back before the read-back comparison:
# BERT's head, pooler and segment table, T5's tied head, BART's logits bias (a zero one is written
# when ours has none: same outputs); and LLaMA's rope_original_positions where the file computes the same.
_FROM_WEIGHTS = {
    "bert": lambda back, c: back.replace(lm_head=c.lm_head, pooler=c.pooler, pair_head=c.pair_head,
                                         type_vocab_size=back.type_vocab_size if c.type_vocab_size else 0),
    "roberta": lambda back, c: back.replace(lm_head=c.lm_head, pooler=c.pooler,
                                            type_vocab_size=back.type_vocab_size if c.type_vocab_size else 0),
    "distilbert": lambda back, c: back.replace(lm_head=c.lm_head),
    "albert": lambda back, c: back.replace(lm_head=c.lm_head, pooler=c.pooler, pair_head=c.pair_head,
                                           type_vocab_size=back.type_vocab_size if c.type_vocab_size else 0),
    "t5": lambda back, c: back.replace(tied_embeddings=c.tied_embeddings),
    "bart": lambda back, c: back.replace(final_logits_bias=c.final_logits_bias),
    "llama": _same_rope,
    "mistral": _same_rope,
    "qwen2": _same_rope,
    "qwen3": _same_rope,
    hf_gemma.MODEL_TYPE: _same_rope,
    **VISION_FROM_WEIGHTS,
}


def config_to_hf(config: ModelConfig) -> dict:
    """The config.json for ``config``; raises when the chosen HF family would compute something else."""
    model_type, architecture = hf_family(config)
    c = config
    ids = dict(pad_token_id=c.pad_token_id, bos_token_id=c.bos_token_id, eos_token_id=c.eos_token_id)
    d = {**_WRITERS[model_type](c), **ids}
    d = {"architectures": [architecture], "model_type": model_type, **d}
    if c.task:  # a task head: its class (BertForSequenceClassification, ...) and its labels
        d.update(head_config_out(c, model_type))
        architecture = d["architectures"][0]

    back = config_from_hf(d)
    if model_type in _FROM_WEIGHTS:
        back = _FROM_WEIGHTS[model_type](back, c)
    back = head_from_file(back, c)
    differ = [f for f in c.to_dict() if f not in _IGNORED]
    differ = [f for f in differ if getattr(back, f) != getattr(c, f)]
    if differ:
        what = ", ".join(f"{f}={getattr(c, f)!r} (a {model_type} file gives {getattr(back, f)!r})" for f in differ)
        raise TformerError(f"this model cannot be saved as {architecture}: {what}")
    lost = [f for f in _DROPOUT_FIELDS if getattr(back, f) != getattr(c, f)]
    if lost:
        warnings.warn(f"{architecture} cannot hold {', '.join(f'{f}={getattr(c, f)}' for f in lost)}; "
                      f"the saved config uses {', '.join(f'{f}={getattr(back, f)}' for f in lost)}", stacklevel=2)
    return d
