"""The KV cache never changes the model's output: step-by-step logits equal a full forward pass."""

import pytest
import torch

from tformer.core.config import ModelConfig
from tformer.model import KVCache, build


def _config(arch, position, **kw):
    return ModelConfig(arch=arch, n_layers=2, d_model=32, n_heads=4, n_kv_heads=2, d_ff=64, vocab_size=40,
                       max_positions=32, position=position, decoder_start_token_id=0, **kw)


@pytest.mark.parametrize("reserve", [None, 16, 6], ids=["growing", "reserved", "reserve-outgrown"])
@pytest.mark.parametrize("position", ["learned", "sinusoidal", "rope", "alibi", "relative"])
def test_decoder_cached_steps_equal_full_forward(position, reserve):
    model = build(_config("decoder", position)).eval()
    ids = torch.randint(0, 40, (2, 10))
    with torch.no_grad():
        full = model(ids).logits
        cache = model.new_cache(reserve=reserve)
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
    reserved = model.new_cache(reserve=20)
    with torch.no_grad():
        model(torch.randint(0, 40, (3, 9)), past_key_values=reserved)
    assert reserved.nbytes == cache.nbytes
    assert reserved.allocated_bytes == 2 * 2 * 20 * 2 * 8 * 3 * 4
    assert cache.allocated_bytes == cache.nbytes  # no reserve: exactly the positions read


def test_a_reserve_is_written_in_place_and_doubles_when_outgrown():
    model = build(_config("decoder", "rope")).eval()
    cache = model.new_cache(reserve=4)
    with torch.no_grad():
        model(torch.randint(0, 40, (1, 3)), past_key_values=cache)
        first = cache.layers[0].k.data_ptr()
        model(torch.randint(0, 40, (1, 1)), past_key_values=cache)
        assert cache.layers[0].k.data_ptr() == first  # the fourth position went into the reserve
        model(torch.randint(0, 40, (1, 1)), past_key_values=cache)
    assert cache.length == 5 and cache.layers[0].capacity == 8
