"""Our post-LN encoder-decoder equals torch.nn.Transformer once the weights are copied across."""

import torch
from torch import nn

from tformer.core.config import ModelConfig
from tformer.model import build, with_attention


def _copy_attention(ours, theirs: nn.MultiheadAttention) -> None:
    # nn.MultiheadAttention packs q, k, v projections into one (3d, d) matrix, in that order.
    wq, wk, wv = theirs.in_proj_weight.chunk(3)
    bq, bk, bv = theirs.in_proj_bias.chunk(3)
    for proj, w, b in ((ours.q_proj, wq, bq), (ours.k_proj, wk, bk), (ours.v_proj, wv, bv)):
        proj.weight.copy_(w)
        proj.bias.copy_(b)
    ours.o_proj.weight.copy_(theirs.out_proj.weight)
    ours.o_proj.bias.copy_(theirs.out_proj.bias)


def _copy_norm(ours, theirs) -> None:
    ours.weight.copy_(theirs.weight)
    ours.bias.copy_(theirs.bias)


def _copy_ffn(ours, layer) -> None:
    ours.up.weight.copy_(layer.linear1.weight)
    ours.up.bias.copy_(layer.linear1.bias)
    ours.down.weight.copy_(layer.linear2.weight)
    ours.down.bias.copy_(layer.linear2.bias)


def _models(norm_first: bool):
    d, heads, d_ff, n_enc, n_dec = 32, 4, 64, 2, 3
    reference = nn.Transformer(d, heads, n_enc, n_dec, d_ff, dropout=0.0, activation="relu",
                               batch_first=True, norm_first=norm_first).eval()
    config = ModelConfig(arch="encoder-decoder", n_layers=n_enc, n_decoder_layers=n_dec, d_model=d, n_heads=heads,
                         d_ff=d_ff, vocab_size=11, position="none", activation="relu", final_norm=True,
                         norm_placement="pre" if norm_first else "post")
    ours = build(config).eval()
    with torch.no_grad():
        for mine, theirs in zip(ours.encoder.layers, reference.encoder.layers):
            _copy_attention(mine.attn, theirs.self_attn)
            _copy_norm(mine.attn_norm, theirs.norm1)
            _copy_ffn(mine.mlp, theirs)
            _copy_norm(mine.mlp_norm, theirs.norm2)
        for mine, theirs in zip(ours.decoder.layers, reference.decoder.layers):
            _copy_attention(mine.attn, theirs.self_attn)
            _copy_norm(mine.attn_norm, theirs.norm1)
            _copy_attention(mine.cross_attn, theirs.multihead_attn)
            _copy_norm(mine.cross_attn_norm, theirs.norm2)
            _copy_ffn(mine.mlp, theirs)
            _copy_norm(mine.mlp_norm, theirs.norm3)
        _copy_norm(ours.encoder.final_norm, reference.encoder.norm)
        _copy_norm(ours.decoder.final_norm, reference.decoder.norm)
    return ours, reference


def _run_both(norm_first: bool, src_padding: bool):
    ours, reference = _models(norm_first)
    src = torch.randn(2, 7, 32)
    tgt = torch.randn(2, 5, 32)
    src_keep = torch.ones(2, 7, dtype=torch.long)
    if src_padding:
        src_keep[1, 4:] = 0  # second source sentence has 4 real tokens
    causal = nn.Transformer.generate_square_subsequent_mask(5)
    with torch.no_grad():
        expected = reference(src, tgt, tgt_mask=causal, src_key_padding_mask=~src_keep.bool(),
                             memory_key_padding_mask=~src_keep.bool())
        memory, _, _ = ours.encoder(src, attention_mask=src_keep)
        got, _, _ = ours.decoder(tgt, memory=memory, memory_mask=src_keep)
    return got, expected, memory, src_keep


def test_post_ln_encoder_decoder_equals_nn_transformer():
    got, expected, _, _ = _run_both(norm_first=False, src_padding=False)
    assert torch.allclose(got, expected, atol=1e-5, rtol=0), (got - expected).abs().max()


def test_post_ln_with_source_padding_equals_nn_transformer():
    got, expected, _, _ = _run_both(norm_first=False, src_padding=True)
    assert torch.allclose(got, expected, atol=1e-5, rtol=0), (got - expected).abs().max()


def test_pre_ln_variant_equals_nn_transformer_norm_first():
    got, expected, _, _ = _run_both(norm_first=True, src_padding=False)
    assert torch.allclose(got, expected, atol=1e-5, rtol=0), (got - expected).abs().max()


def test_reference_attention_path_gives_the_same_result():
    ours, reference = _models(norm_first=False)
    src, tgt = torch.randn(2, 7, 32), torch.randn(2, 5, 32)
    ours = with_attention(ours, "reference")
    with torch.no_grad():
        expected = reference(src, tgt, tgt_mask=nn.Transformer.generate_square_subsequent_mask(5))
        memory, _, _ = ours.encoder(src)
        got, _, _ = ours.decoder(tgt, memory=memory)
    assert torch.allclose(got, expected, atol=1e-5, rtol=0)
