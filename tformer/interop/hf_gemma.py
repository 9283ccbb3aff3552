"""Gemma 3's Hugging Face files (``model_type`` "gemma3_text", ``Gemma3ForCausalLM``): its config.json read into a
ModelConfig and written back, and its weight names.

What a Gemma 3 config holds that a LLaMA one does not, and where it goes here:
    layer_types ("sliding_attention" / "full_attention")  -> layer_types ("sliding" / "full"), attn_window
    rope_parameters per layer type (bases 10,000 / 1e6)   -> rope_local_theta / rope_theta (+ the full layers' scaling)
    query_pre_attn_scalar (scores / sqrt(it))             -> attn_scale_dim
    final_logit_softcapping                               -> logit_softcap
    q_norm, k_norm, four norms per layer, scale 1 + w     -> qk_norm, norm_placement "sandwich", norm "rmsnorm_offset"
    embeddings * sqrt(hidden_size)                        -> scale_embeddings
Refused: attention-score softcapping (attn_logit_softcapping: Gemma 2's, not Gemma 3's), bidirectional attention
(EmbeddingGemma), scaling on the sliding layers' RoPE, and biases (attention_bias).
"""

from __future__ import annotations

from tformer.interop.hf_fields import activation as _activation
from tformer.interop.hf_fields import dropouts as _dropouts
from tformer.interop.hf_fields import refuse as _refuse
from tformer.interop.hf_fields import token_id as _token_id
from tformer.interop.hf_rules import Alias, Rule, linear_rules, norm_rules, with_head

MODEL_TYPE = "gemma3_text"
_LAYER_TYPES = {"sliding_attention": "sliding", "full_attention": "full"}
_LAYER_TYPES_OUT = {ours: hf for hf, ours in _LAYER_TYPES.items()}
_DEFAULT_THETA = {"full_attention": 1_000_000.0, "sliding_attention": 10_000.0}  # Gemma3TextConfig's


def _layer_types(d: dict) -> list[str]:
    n = d["num_hidden_layers"]
    listed = d.get("layer_types")
    if listed is None:  # older files give a period: every sliding_window_pattern-th layer is global
        period = d.get("sliding_window_pattern", 6)
        return ["full" if (i + 1) % period == 0 else "sliding" for i in range(n)]
    unknown = sorted({t for t in listed if t not in _LAYER_TYPES}, key=str)
    if unknown:
        _refuse(MODEL_TYPE, f"layer_types entry {unknown[0]!r} (tformer reads {', '.join(_LAYER_TYPES)})")
    return [_LAYER_TYPES[t] for t in listed]


def _rope_spec(d: dict, layer_type: str) -> dict:
    """One layer type's RoPE settings from rope_parameters (transformers >= 5) or the older flat keys."""
    params = (d.get("rope_parameters") or {}).get(layer_type)
    if params is not None:
        return params
    if layer_type == "full_attention":
        return {**(d.get("rope_scaling") or {"rope_type": "default"}),
                "rope_theta": d.get("rope_theta", _DEFAULT_THETA[layer_type])}
    return {"rope_type": "default", "rope_theta": d.get("rope_local_base_freq", _DEFAULT_THETA[layer_type])}


def read(d: dict, rope) -> dict:
    """ModelConfig fields of a gemma3_text config.json; ``rope`` reads a LLaMA-style RoPE spec (hf_config._rope)."""
    if d.get("attn_logit_softcapping") is not None:
        _refuse(MODEL_TYPE, f"attn_logit_softcapping={d['attn_logit_softcapping']}")
    if d.get("use_bidirectional_attention"):
        _refuse(MODEL_TYPE, "use_bidirectional_attention=true (EmbeddingGemma)")
    if d.get("attention_bias"):
        _refuse(MODEL_TYPE, "attention_bias=true")
    local = _rope_spec(d, "sliding_attention")
    if (local.get("rope_type") or "default") != "default":
        _refuse(MODEL_TYPE, f"rope_type='{local.get('rope_type')}' on the sliding layers (tformer scales the full "
                            "layers' RoPE only)")
    full = rope({"model_type": MODEL_TYPE, "rope_parameters": _rope_spec(d, "full_attention"),
                 "max_position_embeddings": d.get("max_position_embeddings", 131072)})
    types = _layer_types(d)
    hidden, heads = d["hidden_size"], d["num_attention_heads"]
    cap = d.get("final_logit_softcapping")
    longest = d.get("max_position_embeddings", 131072)
    # A window at least the context (HF's default 4096 in a small test config) reaches every key the model reads:
    # the same as the context itself, which tformer's config requires it not to exceed.
    window = min(d.get("sliding_window", 4096), longest) if "sliding" in types else None
    return dict(
        arch="decoder", n_layers=d["num_hidden_layers"], d_model=hidden, n_heads=heads,
        n_kv_heads=d.get("num_key_value_heads") or heads, head_dim=d.get("head_dim", 256),
        d_ff=d["intermediate_size"], vocab_size=d["vocab_size"], max_positions=longest,
        position="rope", **full, rope_local_theta=float(local.get("rope_theta", _DEFAULT_THETA["sliding_attention"])),
        layer_types=types, attn_window=window,
        attn_scale_dim=d.get("query_pre_attn_scalar", 256), logit_softcap=None if cap is None else float(cap),
        norm="rmsnorm_offset", norm_placement="sandwich", norm_eps=d.get("rms_norm_eps", 1e-6), qk_norm=True,
        final_norm=True, activation=_activation(d.get("hidden_activation", "gelu_pytorch_tanh"), MODEL_TYPE),
        gated_mlp=True, bias=False, tied_embeddings=bool(d.get("tie_word_embeddings", True)), scale_embeddings=True,
        pad_token_id=_token_id(d, "pad_token_id", 0), bos_token_id=_token_id(d, "bos_token_id", 2),
        eos_token_id=_token_id(d, "eos_token_id", 1),
        **_dropouts(MODEL_TYPE, dropout=0.0, attention_dropout=d.get("attention_dropout", 0.0), activation_dropout=0.0),
    )


def write(c, rope_out, activation_out) -> dict:
    """The gemma3_text config.json fields of ``c`` (``rope_out``: hf_config._rope_out for the full layers)."""
    full = rope_out(c)["rope_parameters"]
    return dict(num_hidden_layers=c.n_layers, hidden_size=c.d_model, num_attention_heads=c.n_heads,
                num_key_value_heads=c.n_kv_heads, head_dim=c.head_dim, intermediate_size=c.d_ff,
                vocab_size=c.vocab_size, max_position_embeddings=c.max_positions,
                rope_parameters={"full_attention": full, "sliding_attention": {
                    "rope_type": "default", "rope_theta": c.rope_local_theta or c.rope_theta}},
                layer_types=[_LAYER_TYPES_OUT[t] for t in (c.layer_types or ["full"] * c.n_layers)],
                sliding_window=c.attn_window, query_pre_attn_scalar=c.attn_scale_dim or c.head_dim,
                final_logit_softcapping=c.logit_softcap, attn_logit_softcapping=None, rms_norm_eps=c.norm_eps,
                hidden_activation=activation_out[c.activation], attention_bias=False,
                attention_dropout=c.attention_dropout, tie_word_embeddings=c.tied_embeddings)


# Which tformer configs Gemma3ForCausalLM expresses: the fields only it has, at the values it fixes.
FAMILY = ({"norm": "rmsnorm_offset", "norm_placement": "sandwich", "qk_norm": True, "position": "rope",
           "gated_mlp": True, "bias": False, "scale_embeddings": True}, MODEL_TYPE, "Gemma3ForCausalLM")


def rules(c, p: str) -> tuple[list[Rule], list[Alias]]:
    """Gemma3ForCausalLM's tensor names (``p``: "model.") against ours. Its norms store w of the scale 1 + w, as
    ours do (OffsetRMSNorm): copied as they are."""
    out = [Rule(f"{p}embed_tokens.weight", ("tok_embed.weight",))]
    for i in range(c.n_layers):
        h, o = f"{p}layers.{i}", f"decoder.layers.{i}"
        out += norm_rules(f"{h}.input_layernorm", f"{o}.attn_norm", c)
        for x in "qkvo":
            out += linear_rules(f"{h}.self_attn.{x}_proj", f"{o}.attn.{x}_proj", False)
        out += norm_rules(f"{h}.self_attn.q_norm", f"{o}.attn.q_norm", c)
        out += norm_rules(f"{h}.self_attn.k_norm", f"{o}.attn.k_norm", c)
        out += norm_rules(f"{h}.post_attention_layernorm", f"{o}.attn_post_norm", c)
        out += norm_rules(f"{h}.pre_feedforward_layernorm", f"{o}.mlp_norm", c)
        for x in ("gate", "up", "down"):
            out += linear_rules(f"{h}.mlp.{x}_proj", f"{o}.mlp.{x}", False)
        out += norm_rules(f"{h}.post_feedforward_layernorm", f"{o}.mlp_post_norm", c)
    out += norm_rules(f"{p}norm", "decoder.final_norm", c)
    return with_head(out, c, "lm_head.weight", f"{p}embed_tokens.weight")


__all__ = ["FAMILY", "MODEL_TYPE", "read", "rules", "write"]
