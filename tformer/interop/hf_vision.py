"""Hugging Face ViT and CLIP: config.json <-> ModelConfig and the weight-name tables (torch-free).

ViT: ViTForImageClassification (body under "vit.", a "classifier") or the bare ViTModel; CLIPModel with its
text_config and vision_config nested. The readers and writers are registered in tformer.interop.hf_config,
the tables in tformer.interop.hf, beside the text families'.

Where the layouts differ from ours: HF ViT stores cls_token as (1, 1, d) and position_embeddings as (1, n, d)
(ours: (d,) and an (n, d) table), a Rule's ``lead``; HF's ViTModel adds a pooler (dense + tanh over [CLS]) that
tformer does not model: loading drops it (as ViTForImageClassification does), saving writes a ViTModel without
one (load it with ``ViTModel.from_pretrained(path, add_pooling_layer=False)``). CLIP's towers share one
activation and one LayerNorm epsilon in tformer; a file whose towers differ there is refused.
"""

from __future__ import annotations

import re
from typing import Any

from tformer.interop.hf_fields import (
    ACTIVATION_OUT, VISION_ACTIVATIONS, activation, dropouts, labels_out, refuse, token_id,
)
from tformer.interop.hf_rules import Rule, attention_rules, linear_rules, norm_rules


# Config.json -> ModelConfig -------------------------------------------------------------------
def _square(d: dict, key: str, default: int, model_type: str) -> int:
    """image_size / patch_size: an int, or [h, w] with h == w (tformer's images are square)."""
    value = d.get(key, default)
    if isinstance(value, (list, tuple)):
        if len(value) != 2 or value[0] != value[1]:
            refuse(model_type, f"{key}={list(value)} (tformer's models read square images and patches)")
        value = value[0]
    return int(value)


def _images(d: dict, model_type: str, patch: int) -> dict:
    return dict(image_size=_square(d, "image_size", 224, model_type),
                patch_size=_square(d, "patch_size", patch, model_type), num_channels=d.get("num_channels", 3))


def vit_from_hf(d: dict) -> dict:
    if d.get("qkv_bias") is False:
        refuse("vit", "qkv_bias=false (tformer's bias switch covers all of a layer's projections)")
    archs = d.get("architectures") or ["ViTModel"]
    # The classifier's width: id2label (what save_pretrained writes) or num_labels; refined from the weights.
    labels = len(d["id2label"]) if d.get("id2label") else d.get("num_labels", 2)
    return dict(
        arch="vit", n_layers=d["num_hidden_layers"], d_model=d["hidden_size"], n_heads=d["num_attention_heads"],
        d_ff=d["intermediate_size"], **_images(d, "vit", 16),
        n_classes=labels if "ViTForImageClassification" in archs else 0, patch_bias=True, position="learned",
        norm="layernorm", norm_placement="pre", norm_eps=d.get("layer_norm_eps", 1e-12), final_norm=True,
        embedding_norm=False, activation=activation(d.get("hidden_act", "gelu"), "vit", VISION_ACTIVATIONS), bias=True,
        pad_token_id=token_id(d, "pad_token_id"), bos_token_id=token_id(d, "bos_token_id"),
        eos_token_id=token_id(d, "eos_token_id"),
        **dropouts("vit", dropout=d.get("hidden_dropout_prob", 0.0),
                   attention_dropout=d.get("attention_probs_dropout_prob", 0.0), activation_dropout=0.0),
    )


# transformers' CLIPTextConfig / CLIPVisionConfig defaults, for keys a file leaves out
_CLIP_TEXT = dict(num_hidden_layers=12, hidden_size=512, num_attention_heads=8, intermediate_size=2048,
                  vocab_size=49408, max_position_embeddings=77, pad_token_id=1, bos_token_id=49406, eos_token_id=49407)
_CLIP_VISION = dict(num_hidden_layers=12, hidden_size=768, num_attention_heads=12, intermediate_size=3072)
_CLIP_SHARED = dict(hidden_act="quick_gelu", layer_norm_eps=1e-5)


def clip_from_hf(d: dict) -> dict:
    t = {**_CLIP_SHARED, **_CLIP_TEXT, **(d.get("text_config") or {})}
    v = {**_CLIP_SHARED, **_CLIP_VISION, **(d.get("vision_config") or {})}
    for key in _CLIP_SHARED:
        if t[key] != v[key]:
            refuse("clip", f"text {key}={t[key]!r} but vision {key}={v[key]!r} (tformer uses one for both towers)")
    return dict(
        arch="clip", n_layers=t["num_hidden_layers"], d_model=t["hidden_size"], n_heads=t["num_attention_heads"],
        d_ff=t["intermediate_size"], vocab_size=t["vocab_size"], max_positions=t["max_position_embeddings"],
        vision_n_layers=v["num_hidden_layers"], vision_d_model=v["hidden_size"],
        vision_n_heads=v["num_attention_heads"], vision_d_ff=v["intermediate_size"], **_images(v, "clip", 32),
        projection_dim=d.get("projection_dim", 512), logit_scale_init=float(d.get("logit_scale_init_value", 2.6592)),
        position="learned", norm="layernorm", norm_placement="pre", norm_eps=t["layer_norm_eps"], final_norm=True,
        activation=activation(t["hidden_act"], "clip", VISION_ACTIVATIONS), bias=True, tied_embeddings=False,
        pad_token_id=token_id(t, "pad_token_id"), bos_token_id=token_id(t, "bos_token_id"),
        eos_token_id=token_id(t, "eos_token_id"),
        **dropouts("clip", dropout=0.0, attention_dropout=[t.get("attention_dropout", 0.0),
                                                           v.get("attention_dropout", 0.0)], activation_dropout=0.0),
    )


# ModelConfig -> config.json -------------------------------------------------------------------
def vit_to_hf(c) -> dict:
    out = dict(num_hidden_layers=c.n_layers, hidden_size=c.d_model, num_attention_heads=c.n_heads,
               intermediate_size=c.d_ff, image_size=c.image_size, patch_size=c.patch_size,
               num_channels=c.num_channels, hidden_act=ACTIVATION_OUT[c.activation], layer_norm_eps=c.norm_eps,
               qkv_bias=True, encoder_stride=c.patch_size, hidden_dropout_prob=c.dropout,
               attention_probs_dropout_prob=c.attention_dropout)
    if c.n_classes:
        out.update(labels_out(c.n_classes))
    return out


def clip_to_hf(c) -> dict:
    shared = dict(hidden_act=ACTIVATION_OUT[c.activation], layer_norm_eps=c.norm_eps,
                  attention_dropout=c.attention_dropout, projection_dim=c.projection_dim)
    text = dict(num_hidden_layers=c.n_layers, hidden_size=c.d_model, num_attention_heads=c.n_heads,
                intermediate_size=c.d_ff, vocab_size=c.vocab_size, max_position_embeddings=c.max_positions,
                pad_token_id=c.pad_token_id, bos_token_id=c.bos_token_id, eos_token_id=c.eos_token_id,
                model_type="clip_text_model", **shared)
    vision = dict(num_hidden_layers=c.vision_n_layers, hidden_size=c.vision_d_model,
                  num_attention_heads=c.vision_n_heads, intermediate_size=c.vision_d_ff, image_size=c.image_size,
                  patch_size=c.patch_size, num_channels=c.num_channels, model_type="clip_vision_model", **shared)
    return dict(text_config=text, vision_config=vision, projection_dim=c.projection_dim,
                logit_scale_init_value=c.logit_scale_init)


VISION_READERS = {"vit": vit_from_hf, "clip": clip_from_hf}
VISION_WRITERS = {"vit": vit_to_hf, "clip": clip_to_hf}
# Which HF class saves a config (tformer.interop.hf_config.HF_FAMILIES): the first whose requirements hold.
VISION_HF_FAMILIES: dict[str, tuple[tuple[dict[str, Any], str, str], ...]] = {
    "vit": (({"n_classes": bool}, "vit", "ViTForImageClassification"), ({}, "vit", "ViTModel")),
    "clip": (({}, "clip", "CLIPModel"),),
}
# Fields no HF file holds because these models never read them (a ViT has no vocabulary, no text positions,
# no language-model head; CLIP's text tower has no head to tie): copied back before the read-back comparison.
VISION_FROM_WEIGHTS = {
    "vit": lambda back, c: back.replace(vocab_size=c.vocab_size, max_positions=c.max_positions,
                                        tied_embeddings=c.tied_embeddings, lm_head=c.lm_head),
    "clip": lambda back, c: back.replace(tied_embeddings=c.tied_embeddings, lm_head=c.lm_head),
}


# Weight names -------------------------------------------------------------------------------------
def vit_rules(c, p: str) -> tuple[list[Rule], list]:
    e = f"{p}embeddings"
    rules = [Rule(f"{e}.cls_token", ("encoder.patch_embed.cls_token",), lead=2),
             Rule(f"{e}.position_embeddings", ("encoder.positions.weight",), lead=1),
             *linear_rules(f"{e}.patch_embeddings.projection", "encoder.patch_embed.proj", True)]
    names = tuple(f"attention.{n}" for n in ("attention.query", "attention.key", "attention.value", "output.dense"))
    for i in range(c.n_layers):
        h, o = f"{p}encoder.layer.{i}", f"encoder.layers.{i}"
        rules += norm_rules(f"{h}.layernorm_before", f"{o}.attn_norm", c)
        rules += attention_rules(h, f"{o}.attn", names, True)
        rules += norm_rules(f"{h}.layernorm_after", f"{o}.mlp_norm", c)
        rules += linear_rules(f"{h}.intermediate.dense", f"{o}.mlp.up", True)
        rules += linear_rules(f"{h}.output.dense", f"{o}.mlp.down", True)
    rules += norm_rules(f"{p}layernorm", "encoder.final_norm", c)
    if c.n_classes:
        rules += linear_rules("classifier", "head", True)
    return rules, []


def _clip_tower(c, hf: str, ours: str, layers: int) -> list[Rule]:
    rules = []
    for i in range(layers):
        h, o = f"{hf}.encoder.layers.{i}", f"{ours}.layers.{i}"
        rules += norm_rules(f"{h}.layer_norm1", f"{o}.attn_norm", c)
        rules += attention_rules(f"{h}.self_attn", f"{o}.attn", ("q_proj", "k_proj", "v_proj", "out_proj"), c.bias)
        rules += norm_rules(f"{h}.layer_norm2", f"{o}.mlp_norm", c)
        rules += linear_rules(f"{h}.mlp.fc1", f"{o}.mlp.up", c.bias)
        rules += linear_rules(f"{h}.mlp.fc2", f"{o}.mlp.down", c.bias)
    return rules


def clip_rules(c, p: str) -> tuple[list[Rule], list]:
    v, t = f"{p}vision_model", f"{p}text_model"
    rules = [Rule(f"{v}.embeddings.class_embedding", ("vision.patch_embed.cls_token",)),
             Rule(f"{v}.embeddings.patch_embedding.weight", ("vision.patch_embed.proj.weight",)),
             Rule(f"{v}.embeddings.position_embedding.weight", ("vision.positions.weight",))]
    rules += norm_rules(f"{v}.pre_layrnorm", "vision.embed_norm", c)  # sic: HF's spelling
    rules += _clip_tower(c, v, "vision", c.vision_n_layers)
    rules += norm_rules(f"{v}.post_layernorm", "vision.pool_norm", c)
    rules += [Rule(f"{t}.embeddings.token_embedding.weight", ("tok_embed.weight",)),
              Rule(f"{t}.embeddings.position_embedding.weight", ("text.positions.weight",))]
    rules += _clip_tower(c, t, "text", c.n_layers)
    rules += norm_rules(f"{t}.final_layer_norm", "text.final_norm", c)
    rules += [Rule(f"{p}visual_projection.weight", ("head.vision_proj.weight",)),
              Rule(f"{p}text_projection.weight", ("head.text_proj.weight",)),
              Rule(f"{p}logit_scale", ("head.logit_scale",))]
    return rules, []


VISION_RULES = {"vit": vit_rules, "clip": clip_rules}
VISION_PREFIX = {"vit": "vit.", "clip": ""}  # ViTForImageClassification's body; a bare ViTModel has none
# Tensors of a file that tformer's model has no place for and that change none of the outputs it computes:
# ViTModel's pooler (dense + tanh over [CLS]: its pooler_output, not the hidden states or the logits).
VISION_UNUSED = {"vit": (re.compile(r"^pooler\.dense\.(weight|bias)$"),)}


def vision_refine(config, model_type: str, keys: dict) -> Any:
    """What config.json cannot say but the tensors do: whether a ViT file has a classifier, and its width
    (``keys``: name -> tensor, real or meta; only shapes are read)."""
    if model_type != "vit":
        return config
    head = keys.get("classifier.weight")
    return config.replace(n_classes=int(head.shape[0]) if head is not None else 0)


def is_bare(config, model_type: str) -> bool:
    """A config saved without a task head (a ViTModel: no "vit." prefix)."""
    return model_type == "vit" and not config.n_classes
