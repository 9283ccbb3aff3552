"""The named presets: sizes from the papers and the released config files, as plain dicts of ModelConfig fields.

tformer.core.config builds them (``preset(name)``); this module holds only the data, so it imports nothing.
"""

from __future__ import annotations

from typing import Any

# Presets -----------------------------------------------------------------------------
# Sizes from the papers and the released config files:
#   Vaswani et al. 2017 Table 3; GPT-2 (Radford et al. 2019) released configs;
#   BERT (Devlin et al. 2018); T5 (Raffel et al. 2020) v1.0 configs; BART (Lewis et al. 2019);
#   LLaMA (Touvron et al. 2023a, 7B/13B) and Llama 2 70B (2023b, GQA with 8 KV heads);
#   GPT-3 (Brown et al. 2020, Table 2.1; its alternating sparse attention is not modelled).
#   RoBERTa, DistilBERT, ALBERT: the Hub's roberta-base, distilbert-base-uncased and albert-base-v2 config.json.

_GPT2 = dict(arch="decoder", vocab_size=50257, max_positions=1024, position="learned", norm="layernorm",
             norm_placement="pre", activation="gelu_tanh", bias=True, tied_embeddings=True, norm_eps=1e-5,
             dropout=0.1, attention_dropout=0.1, bos_token_id=50256, eos_token_id=50256)
_BERT = dict(arch="encoder", vocab_size=30522, max_positions=512, position="learned", norm="layernorm",
             norm_placement="post", norm_eps=1e-12, final_norm=False, embedding_norm=True, activation="gelu",
             type_vocab_size=2, pooler=True, lm_head=False, tied_embeddings=True, dropout=0.1,
             attention_dropout=0.1, pad_token_id=0)
_T5 = dict(arch="encoder-decoder", vocab_size=32128, max_positions=512, position="relative", head_dim=64,
           norm="rmsnorm", norm_placement="pre", norm_eps=1e-6, activation="relu", bias=False,
           tied_embeddings=True, rescale_tied_head=True, scale_attention=False, dropout=0.1,
           pad_token_id=0, eos_token_id=1, decoder_start_token_id=0)
_LLAMA = dict(arch="decoder", vocab_size=32000, max_positions=2048, position="rope", norm="rmsnorm",
              norm_placement="pre", norm_eps=1e-6, activation="silu", gated_mlp=True, bias=False,
              tied_embeddings=False, bos_token_id=1, eos_token_id=2)
# Gemma 3 (Gemma Team 2025; google/gemma-3-270m and -1b-pt config.json): five sliding-window layers (512 keys,
# RoPE base 10,000) then one global (base 1,000,000), q/k norms, sandwich norms scaled by 1 + w, GeGLU (tanh),
# embeddings * sqrt(d), head_dim 256 whatever d_model is, scores / sqrt(256), a 262,144-token vocabulary.
_GEMMA3 = dict(arch="decoder", vocab_size=262144, max_positions=32768, position="rope", rope_theta=1_000_000.0,
               rope_local_theta=10_000.0, attn_window=512, norm="rmsnorm_offset", norm_placement="sandwich",
               norm_eps=1e-6, qk_norm=True, activation="gelu_tanh", gated_mlp=True, bias=False, tied_embeddings=True,
               scale_embeddings=True, n_kv_heads=1, head_dim=256, attn_scale_dim=256, pad_token_id=0, bos_token_id=2,
               eos_token_id=1)


def _gemma3_layers(n: int) -> list[str]:
    return ["full" if (i + 1) % 6 == 0 else "sliding" for i in range(n)]


_VASWANI = dict(arch="encoder-decoder", vocab_size=37000, max_positions=1024, position="sinusoidal",
                norm="layernorm", norm_placement="post", final_norm=False, activation="relu", bias=True,
                tied_embeddings=True, scale_embeddings=True, norm_eps=1e-6)

# ViT (Dosovitskiy et al. 2020, Table 1; google/vit-*-patch*-224 configs) with the 1,000-class ImageNet head;
# tiny and small are DeiT's sizes (Touvron et al. 2021, facebook/deit-*-patch16-224), the same architecture.
_VIT = dict(arch="vit", image_size=224, num_channels=3, n_classes=1000, position="learned", norm="layernorm",
            norm_placement="pre", norm_eps=1e-12, final_norm=True, activation="gelu", bias=True)
_VIT_SIZES = {"tiny": (12, 192, 3, 768), "small": (12, 384, 6, 1536), "base": (12, 768, 12, 3072),
              "large": (24, 1024, 16, 4096)}
# CLIP (Radford et al. 2021): openai/clip-vit-base-patch32 and -patch16's configs (text 512 wide, 8 heads, 77
# positions, BPE vocabulary of 49,408; vision ViT-B; a 512-wide shared embedding).
_CLIP = dict(arch="clip", n_layers=12, d_model=512, n_heads=8, d_ff=2048, vocab_size=49408, max_positions=77,
             vision_n_layers=12, vision_d_model=768, vision_n_heads=12, vision_d_ff=3072, image_size=224, num_channels=3,
             projection_dim=512, position="learned", norm="layernorm", norm_placement="pre", norm_eps=1e-5,
             activation="quick_gelu", bias=True, tied_embeddings=False, pad_token_id=1, bos_token_id=49406,
             eos_token_id=49407)

_BERT_LIKE = {k: v for k, v in _BERT.items() if k not in ("type_vocab_size", "pooler", "lm_head")}

PRESETS: dict[str, dict[str, Any]] = {
    "char-small": dict(arch="decoder", n_layers=4, d_model=256, n_heads=4, d_ff=1024, vocab_size=65,
                       max_positions=128, position="learned", norm="layernorm", norm_placement="pre",
                       activation="gelu", tied_embeddings=True, bias=True),
    "vaswani-base": dict(_VASWANI, n_layers=6, n_decoder_layers=6, d_model=512, n_heads=8, d_ff=2048, dropout=0.1),
    "vaswani-big": dict(_VASWANI, n_layers=6, n_decoder_layers=6, d_model=1024, n_heads=16, d_ff=4096, dropout=0.3),
    "gpt2": dict(_GPT2, n_layers=12, d_model=768, n_heads=12, d_ff=3072),
    "gpt2-medium": dict(_GPT2, n_layers=24, d_model=1024, n_heads=16, d_ff=4096),
    "gpt2-large": dict(_GPT2, n_layers=36, d_model=1280, n_heads=20, d_ff=5120),
    "gpt2-xl": dict(_GPT2, n_layers=48, d_model=1600, n_heads=25, d_ff=6400),
    "gpt3-175b": dict(_GPT2, n_layers=96, d_model=12288, n_heads=96, d_ff=49152, max_positions=2048,
                      activation="gelu", dropout=0.0, attention_dropout=0.0),
    "bert-base": dict(_BERT, n_layers=12, d_model=768, n_heads=12, d_ff=3072),
    "bert-large": dict(_BERT, n_layers=24, d_model=1024, n_heads=16, d_ff=4096),
    # RobertaForMaskedLM: one segment row, 514 position rows (ids start after pad_token_id = 1)
    "roberta-base": dict(_BERT_LIKE, n_layers=12, d_model=768, n_heads=12, d_ff=3072, vocab_size=50265,
                         position_offset=2, norm_eps=1e-5, type_vocab_size=1, lm_head=True,
                         pad_token_id=1, bos_token_id=0, eos_token_id=2),
    # DistilBertForMaskedLM: BERT's sizes, half the layers, no segments, no pooler
    "distilbert-base": dict(_BERT_LIKE, n_layers=6, d_model=768, n_heads=12, d_ff=3072, lm_head=True),
    # AlbertForMaskedLM: E = 128, one layer shared by all 12 (pretraining adds pooler=true, pair_head=true: SOP)
    "albert-base": dict(_BERT_LIKE, n_layers=12, d_model=768, n_heads=12, d_ff=3072, vocab_size=30000,
                        embed_dim=128, share_layers=True, type_vocab_size=2, lm_head=True,
                        activation="gelu_tanh", dropout=0.0, attention_dropout=0.0, bos_token_id=2, eos_token_id=3),
    "t5-small": dict(_T5, n_layers=6, n_decoder_layers=6, d_model=512, n_heads=8, d_ff=2048),
    "t5-base": dict(_T5, n_layers=12, n_decoder_layers=12, d_model=768, n_heads=12, d_ff=3072),
    "bart-base": dict(arch="encoder-decoder", n_layers=6, n_decoder_layers=6, d_model=768, n_heads=12, d_ff=3072,
                      vocab_size=50265, max_positions=1024, position="learned", position_offset=2,
                      norm="layernorm", norm_placement="post", final_norm=False, embedding_norm=True,
                      activation="gelu", bias=True, tied_embeddings=True, final_logits_bias=True,
                      dropout=0.1, pad_token_id=1, bos_token_id=0, eos_token_id=2, decoder_start_token_id=2),
    "llama-7b": dict(_LLAMA, n_layers=32, d_model=4096, n_heads=32, d_ff=11008),
    "llama-13b": dict(_LLAMA, n_layers=40, d_model=5120, n_heads=40, d_ff=13824),
    "llama-70b": dict(_LLAMA, n_layers=80, d_model=8192, n_heads=64, n_kv_heads=8, d_ff=28672,
                      max_positions=4096, norm_eps=1e-5),
    # Mistral 7B v0.1 (Jiang et al. 2023): LLaMA's layout with GQA and a 4096-token sliding window.
    "mistral-7b": dict(_LLAMA, n_layers=32, d_model=4096, n_heads=32, n_kv_heads=8, d_ff=14336, max_positions=32768,
                       rope_theta=10000.0, norm_eps=1e-5, attn_impl="sliding", attn_window=4096),
    **{f"vit-{size}-{patch}": dict(_VIT, n_layers=n, d_model=d, n_heads=h, d_ff=f, patch_size=patch)
       for size, (n, d, h, f) in _VIT_SIZES.items() for patch in (16, 32)},
    "gemma3-270m": dict(_GEMMA3, n_layers=18, d_model=640, n_heads=4, d_ff=2048, layer_types=_gemma3_layers(18)),
    "gemma3-1b": dict(_GEMMA3, n_layers=26, d_model=1152, n_heads=4, d_ff=6912, layer_types=_gemma3_layers(26)),
    "clip-vit-b-32": dict(_CLIP, patch_size=32),
    "clip-vit-b-16": dict(_CLIP, patch_size=16),
    # Small enough to train on scikit-learn's 8x8 digits on a laptop CPU in minutes (`tformer train --task ...`):
    # 4x4 patches (n = 5 tokens), 10 classes; CLIP's text tower reads the caption tokenizer's characters.
    "vit-digits": dict(_VIT, n_layers=4, d_model=128, n_heads=4, d_ff=256, image_size=8, patch_size=4, num_channels=1,
                       n_classes=10, norm_eps=1e-6, dropout=0.1),
    "clip-digits": dict(_CLIP, n_layers=2, d_model=64, n_heads=4, d_ff=128, vocab_size=64, max_positions=32,
                        vision_n_layers=4, vision_d_model=128, vision_n_heads=4, vision_d_ff=256, image_size=8,
                        patch_size=4, num_channels=1, projection_dim=64, pad_token_id=0, bos_token_id=None,
                        eos_token_id=1),
}
