"""Ledger rows of the tiled and chunked kinds: matmul FLOPs equal FlopCounterMode (forward, train with the
backward's recompute, decode), tiled's memory linear in n, its block pairs as the model computes them."""

from __future__ import annotations

import pytest
import torch

from tformer.core.config import ModelConfig
from tformer.cost.attention_exact import tiled_blocks
from tformer.cost.ledger import ledger
from tformer.measure.flops import FlopCounter
from tformer.model import build

KINDS = ("tiled", "chunked")


def _config(arch, kind, block):
    enc_dec = arch == "encoder-decoder"
    return ModelConfig(arch=arch, n_layers=2, d_model=32, n_heads=4, n_kv_heads=2, d_ff=64, vocab_size=50,
                       max_positions=64, attn_impl=kind, attn_block=block, lm_head=True,
                       decoder_start_token_id=0 if enc_dec else None)


def _counted(model, config, seq, train):
    ids = torch.randint(0, 50, (2, seq))
    kwargs = {"decoder_input_ids": torch.randint(0, 50, (2, seq))} if config.arch == "encoder-decoder" else {}
    model.train(train)
    with torch.set_grad_enabled(train), FlopCounter() as fc:
        out = model(ids, **kwargs)
        if train:
            out.logits.sum().backward()
    return fc.get_total_flops()


@pytest.mark.parametrize(("seq", "block"), [(37, 8), (16, 64)])
@pytest.mark.parametrize("arch", ["decoder", "encoder", "encoder-decoder"])
@pytest.mark.parametrize("kind", KINDS)
def test_matmul_flops_equal_flop_counter_forward_and_train(kind, arch, seq, block):
    config = _config(arch, kind, block)
    model = build(config)
    for phase in ("forward", "train"):
        lg = ledger(config, phase=phase, batch=2, seq=seq)
        assert lg.flops["matmul"] == _counted(model, config, seq, phase == "train"), phase


def test_the_backwards_recompute_rows_sit_before_the_attention_backward_and_only_in_training():
    config = _config("decoder", "tiled", 8)
    assert not ledger(config, phase="forward", seq=37).select(phase="recompute")
    lg = ledger(config, phase="train", seq=37)
    redone = lg.select(phase="recompute")
    assert [op.name for op in redone] == ["decoder.layers.1.attn.scores", "decoder.layers.0.attn.scores"]
    names = [(op.name, op.phase) for op in lg.ops]
    at = names.index(("decoder.layers.1.attn.scores", "recompute"))
    assert names[at + 1] == ("decoder.layers.1.attn.context", "backward")
    forward = lg.select(phase="forward", kind="scores", layer=1)[0]
    assert redone[0].matmul_flops == forward.matmul_flops and redone[0].saved_bytes == 0
    chunked = ledger(_config("decoder", "chunked", 8), phase="train", seq=37).select(phase="recompute", layer=0)
    assert [op.kind for op in chunked] == ["scores", "softmax"]


def test_a_decode_step_costs_what_the_model_counts():
    config = _config("decoder", "tiled", 8)
    model = build(config).eval()
    cache = model.new_cache()
    with torch.no_grad():
        model(torch.randint(0, 50, (2, 21)), past_key_values=cache)
        with FlopCounter() as fc:
            model(torch.randint(0, 50, (2, 1)), past_key_values=cache)
    assert ledger(config, phase="decode", batch=2, seq=22).flops["matmul"] == fc.get_total_flops()


def test_tiled_block_pairs_skip_only_whole_future_blocks():
    assert tiled_blocks(16, 16, 8, causal=False) == (256, 32)
    # causal: block 0 sees key block 0, block 1 both (the diagonal blocks computed in full)
    assert tiled_blocks(16, 16, 8, causal=True) == (8 * 8 + 8 * 16, 8 + 16)
    # n = 37, block 8: the last query block has 5 rows and its key blocks end ragged at 37
    assert tiled_blocks(37, 37, 8, causal=True) == (8 * 8 + 8 * 16 + 8 * 24 + 8 * 32 + 5 * 37, 8 + 16 + 24 + 32 + 37)
    assert tiled_blocks(1, 40, 8, causal=True) == (40, 40)  # a decode step reads every cached key


def _attention_memory(kind, seq, block=64):
    lg = ledger(_config("decoder", kind, block).replace(max_positions=8192), phase="train", batch=1, seq=seq)
    rows = lg.select(phase="forward", kind=("scores", "softmax", "context"))
    return sum(op.saved_bytes for op in rows), sum(op.scores_bytes for op in rows)


@pytest.mark.parametrize("n", [512, 1024, 4096])
def test_tiled_attention_memory_grows_linearly_in_n(n):
    saved, scores = _attention_memory("tiled", n)
    saved2, scores2 = _attention_memory("tiled", 2 * n)
    assert scores == scores2 == 0 and saved2 == 2 * saved
    _, ref_scores = _attention_memory("reference", n)
    assert ref_scores > 0 and _attention_memory("reference", 2 * n)[1] == 4 * ref_scores
    _, chunk_scores = _attention_memory("chunked", n)
    assert chunk_scores == 2 * 4 * 64 * n * 4 and _attention_memory("chunked", 2 * n)[1] == 2 * chunk_scores


def test_tiled_bytes_read_k_and_v_once_per_query_block():
    lg = ledger(_config("encoder", "tiled", 16), phase="forward", batch=1, seq=64)
    scores, softmax, context = lg.select(kind=("scores", "softmax", "context"), layer=0)
    q = 4 * 64 * 8 * 4  # B H T D bytes
    kv = 2 * 64 * 8 * 4
    assert scores.bytes_read == q + 4 * kv and context.bytes_read == 4 * kv
    assert scores.bytes_written == 0 and softmax.bytes_written == 4 * 64 * 4 and context.bytes_written == q
