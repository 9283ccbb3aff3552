"""Every attention kind, used the way users use a model (issue 15, item 7): it trains (a finite loss and
gradients on every parameter the loss reaches), a causal kind generates with its KV cache (or recurrent
state) the same tokens as recomputing the whole sequence each step, greedy and beam search, and a kind
that cannot be causal says so in one line."""

from __future__ import annotations

import pytest
import torch

from tformer.core.attention_kinds import ATTN_KINDS
from tformer.core.config import ModelConfig
from tformer.core.errors import TformerError
from tformer.data.batch import example_batch
from tformer.generate import generate
from tformer.model import build, runner_for

CAUSAL = [name for name, kind in ATTN_KINDS.items() if kind.causal]
# LSH buckets a new token against the cached keys alone, not the chunks a full forward sorts: a cached
# decode is its own approximation (tformer.model.attention.lsh), so its tokens may differ from a recompute.
CACHE_EQUALS_RECOMPUTE = [name for name in CAUSAL if name != "lsh"]
SETTINGS = {"attn_window": 4, "attn_block": 4, "attn_global": 1, "attn_random": 1, "attn_features": 16, "attn_proj": 8}


def _config(kind: str, arch: str = "decoder", **extra) -> ModelConfig:
    seq2seq = arch == "encoder-decoder"
    return ModelConfig(arch=arch, n_layers=2, d_model=32, n_heads=4, n_kv_heads=2, d_ff=48, vocab_size=37,
                       max_positions=64, position="rope" if arch != "encoder" else "learned", attn_impl=kind,
                       lm_head=True, decoder_start_token_id=0 if seq2seq else None, **SETTINGS, **extra)


@pytest.mark.parametrize("kind", list(ATTN_KINDS))
def test_every_kind_trains(kind):
    arch = "decoder" if ATTN_KINDS[kind].causal else "encoder"
    torch.manual_seed(0)
    model = build(_config(kind, arch)).train()
    runner = runner_for(model)
    ids = torch.randint(3, 37, (2, 23))
    batch = example_batch(model.config, ids)
    loss = runner.loss(batch)
    loss.backward()
    assert torch.isfinite(loss)
    grads = [p.grad for p in model.parameters() if p.requires_grad]
    assert all(g is not None and torch.isfinite(g).all() for g in grads)


@pytest.mark.parametrize("kind", CACHE_EQUALS_RECOMPUTE)
@pytest.mark.parametrize("arch", ["decoder", "encoder-decoder"])
def test_cached_generation_equals_recomputing_every_step(kind, arch):
    torch.manual_seed(1)
    model = build(_config(kind, arch)).eval()
    prompt = torch.randint(3, 37, (2, 9))
    cached = generate(model, prompt, max_new_tokens=14, stop_tokens=[]).tokens
    full = generate(model, prompt, max_new_tokens=14, stop_tokens=[], use_cache=False).tokens
    assert torch.equal(cached, full)
    beams = generate(model, prompt, max_new_tokens=6, stop_tokens=[], num_beams=3).tokens
    beams_full = generate(model, prompt, max_new_tokens=6, stop_tokens=[], num_beams=3, use_cache=False).tokens
    assert torch.equal(beams, beams_full)


def test_lsh_decodes_with_its_cache():
    model = build(_config("lsh")).eval()
    out = generate(model, torch.randint(3, 37, (2, 9)), max_new_tokens=10, stop_tokens=[]).tokens
    assert out.shape == (2, 10) and int(out.min()) >= 0 and int(out.max()) < 37


@pytest.mark.parametrize("kind", [name for name, k in ATTN_KINDS.items() if not k.causal])
@pytest.mark.parametrize("arch", ["decoder", "encoder-decoder"])
def test_a_kind_that_cannot_be_causal_says_so_in_one_line(kind, arch):
    with pytest.raises(TformerError) as err:
        _config(kind, arch)
    assert "cannot be causal" in str(err.value) and "\n" not in str(err.value)


@pytest.mark.parametrize("kind", [name for name, k in ATTN_KINDS.items() if k.family != "exact" and name != "sliding"])
def test_weights_are_refused_where_the_kind_forms_none(kind):
    """The maps come from the reference kind; a sparse or approximate layer must not silently hand back
    dense attention's output with them."""
    arch = "decoder" if ATTN_KINDS[kind].causal else "encoder"
    model = build(_config(kind, arch)).eval()
    with pytest.raises(TformerError, match=f"runs '{kind}'"):
        model(torch.randint(3, 37, (1, 9)), output_attentions=True)
    assert model(torch.randint(3, 37, (1, 9))).logits.shape == (1, 9, 37)
