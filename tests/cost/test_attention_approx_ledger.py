"""The ledger's rows for the approximate attention kinds against PyTorch: matmul FLOPs equal
FlopCounterMode (forward, training, prefill and decode), parameters equal numel, the recurrent state's
bytes equal the cache the model holds; and the attention FLOPs grow about linearly in n."""

from __future__ import annotations

import pytest
import torch

from tformer.core.config import ModelConfig
from tformer.cost.ledger import Workload, ledger
from tformer.measure.flops import FlopCounter
from tformer.model import build

CAUSAL = ["linear", "performer", "lsh"]
BIDIRECTIONAL = ["linear", "performer", "linformer", "lsh"]


def _config(name, arch, **kw):
    fields = dict(n_layers=2, d_model=32, n_heads=4, n_kv_heads=2, d_ff=64, vocab_size=40, max_positions=64,
                  position="rope", attn_impl=name, attn_block=4, attn_features=12, attn_proj=6, attn_hashes=2,
                  lm_head=True)
    fields.update(kw)
    return ModelConfig(arch=arch, **fields)


def _count(model, ids, train):
    model.train(train)
    with torch.set_grad_enabled(train), FlopCounter() as fc:
        out = model(ids)
        if train:
            out.logits.float().sum().backward()
    return fc.get_total_flops()


@pytest.mark.parametrize("train", [False, True], ids=["forward", "train"])
@pytest.mark.parametrize("name,arch", [(n, "decoder") for n in CAUSAL] + [(n, "encoder") for n in BIDIRECTIONAL])
def test_matmul_flops_equal_flop_counter(name, arch, train):
    config = _config(name, arch)
    torch.manual_seed(0)
    model = build(config)
    for seq in (11, 16):  # a last chunk cut short, and whole chunks
        measured = _count(model, torch.randint(0, 40, (2, seq)), train)
        lg = ledger(config, Workload(phase="train" if train else "forward", batch=2, seq=seq))
        assert lg.flops["matmul"] == measured, (name, arch, seq)
        assert lg.params["total"] == sum(p.numel() for p in model.parameters())


@pytest.mark.parametrize("name", CAUSAL)
def test_prefill_and_decode_flops_and_cache_bytes_equal_the_model(name):
    config = _config(name, "decoder")
    model = build(config).eval()
    with torch.no_grad():
        cache = model.new_cache()
        with FlopCounter() as prefill:
            model(torch.randint(0, 40, (2, 7)), past_key_values=cache)
        with FlopCounter() as step:
            model(torch.randint(0, 40, (2, 1)), past_key_values=cache)
    assert ledger(config, Workload(phase="prefill", batch=2, seq=7)).flops["matmul"] == prefill.get_total_flops()
    decode = ledger(config, Workload(phase="decode", batch=2, seq=8, context=7))
    assert decode.flops["matmul"] == step.get_total_flops()
    assert decode.memory["kv_cache"] == cache.nbytes


@pytest.mark.parametrize("name", ["linear", "performer"])
def test_kernelised_state_is_flat_in_context_and_forms_no_score_matrix(name):
    config = _config(name, "decoder", max_positions=8192)
    short = ledger(config, Workload(phase="decode", batch=1, seq=128, context=127))
    long = ledger(config, Workload(phase="decode", batch=1, seq=4096, context=4095))
    assert short.memory["kv_cache"] == long.memory["kv_cache"] > 0
    assert short.flops["matmul"] == long.flops["matmul"]  # O(1) per token
    train = ledger(config, Workload(phase="train", batch=1, seq=1024))
    assert all(op.scores_bytes == 0 for op in train.ops)


@pytest.mark.parametrize("name,arch", [(n, "decoder") for n in CAUSAL] + [(n, "encoder") for n in BIDIRECTIONAL])
def test_attention_flops_grow_about_linearly_in_n(name, arch):
    config = _config(name, arch, max_positions=4096, d_model=256, n_heads=4, n_kv_heads=4, attn_block=64,
                     attn_features=64, attn_proj=128)

    def attention(seq):
        lg = ledger(config, Workload(phase="forward", batch=1, seq=seq))
        return sum(op.flops for op in lg.ops if op.kind in ("scores", "softmax", "context") or ".attend" in op.name)

    ratio = attention(4096) / attention(1024)
    assert 3.5 < ratio < 5.0, ratio  # 4x the tokens: about 4x the work (n², dense, would be 16x)
