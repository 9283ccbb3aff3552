"""The KV cache never changes the model's output: step-by-step logits equal a full forward pass."""

import pytest
import torch

from tformer.core.config import ModelConfig
from tformer.model import KVCache, build


def _config(arch, position, **kw):
    return ModelConfig(arch=arch, n_layers=2, d_model=32, n_heads=4, n_kv_heads=2, d_ff=64, vocab_size=40,
                       max_positions=32, position=position, decoder_start_token_id=0, **kw)


@pytest.mark.parametrize("static", [False, True])
@pytest.mark.parametrize("position", ["learned", "sinusoidal", "rope", "alibi", "relative"])
def test_decoder_cached_steps_equal_full_forward(position, static):
    model = build(_config("decoder", position)).eval()
    ids = torch.randint(0, 40, (2, 10))
    with torch.no_grad():
        full = model(ids).logits
        cache = model.new_cache(max_length=16 if static else None)
        prefix = model(ids[:, :4], past_key_values=cache).logits
        steps = [prefix] + [model(ids[:, t : t + 1], past_key_values=cache).logits for t in range(4, 10)]
    assert torch.allclose(torch.cat(steps, dim=1), full, atol=1e-5, rtol=0)
    assert cache.length == 10


@pytest.mark.parametrize("position", ["learned", "sinusoidal", "relative"])
def test_encoder_decoder_cached_steps_equal_full_forward(position):
    model = build(_config("encoder-decoder", position)).eval()
    src, tgt = torch.randint(0, 40, (2, 7)), torch.randint(0, 40, (2, 6))
    with torch.no_grad():
        full = model(src, decoder_input_ids=tgt).logits
        memory, _ = model.encode(src)
        cache = model.new_cache()
        steps = [model.decode(tgt[:, t : t + 1], memory, cache=cache)[0] for t in range(6)]
    assert torch.allclose(torch.cat(steps, dim=1), full, atol=1e-5, rtol=0)


def test_cache_bytes_are_the_tensors_it_holds():
    config = _config("decoder", "rope")
    model = build(config).eval()
    with torch.no_grad():
        out = model(torch.randint(0, 40, (3, 9)), use_cache=True)
    cache: KVCache = out.past_key_values
    # 2 (k and v) x layers x tokens x kv_heads x head_dim x batch x 4 bytes
    assert cache.nbytes == 2 * 2 * 9 * 2 * 8 * 3 * 4
    static = model.new_cache(max_length=20)
    with torch.no_grad():
        model(torch.randint(0, 40, (3, 9)), past_key_values=static)
    assert static.nbytes == cache.nbytes
    assert static.allocated_bytes == 2 * 2 * 20 * 2 * 8 * 3 * 4


def test_static_cache_overflow_is_reported():
    model = build(_config("decoder", "rope")).eval()
    cache = model.new_cache(max_length=4)
    with pytest.raises(ValueError, match="static KV cache holds 4"):
        model(torch.randint(0, 40, (1, 5)), past_key_values=cache)
