"""The ledger against PyTorch itself: params == numel, matmul FLOPs == FlopCounterMode (forward and
forward+backward, decode and prefill), KV-cache bytes == the cache the model allocates."""

from __future__ import annotations

import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tformer.core.config import ModelConfig, preset, preset_names
from tformer.core.errors import TformerError
from tformer.cost.ledger import Workload, ledger
from tformer.measure.flops import FlopCounter
from tformer.model import build

# Presets small enough to run for real on a CPU in a test; the rest run on the meta device.
# (T5's relative-bias masks read tensor values, so the T5 presets run for real.)
REAL_PRESETS = {"t5-small", "t5-base"}


def _meta_safe(model):
    """The token-id range check and CLIP's end-token search read tensor values, which meta tensors do not have;
    skip only them (a meta CLIP pools every text at its last position, as the ids built here end there)."""
    if model.config.arch == "vit":
        return model  # no token ids; PatchEmbed.check reads shapes and dtypes only
    model.embed = lambda ids: model.tok_embed(ids) * model.embed_scale if model.embed_scale != 1.0 else model.tok_embed(ids)
    if model.config.arch == "clip":
        model.text_ends = lambda ids: torch.full(ids.shape[:1], ids.shape[1] - 1, dtype=torch.long, device=ids.device)
    return model


def _ids(config, batch, seq, device):
    return torch.randint(0, config.vocab_size, (batch, seq), device=device) if device != "meta" else \
        torch.zeros(batch, seq, dtype=torch.long, device="meta")


def _pixels(config, batch, device):
    size = config.image_size
    return torch.randn(batch, config.num_channels, size, size, device=device) if device != "meta" else \
        torch.zeros(batch, config.num_channels, size, size, device="meta")


def _inputs(config, batch, seq, seq_dec, device) -> tuple[tuple, dict]:
    """What the model reads: token ids; a ViT's pixel values; CLIP's pixel values and ids, each text ending in
    the end token (the position CLIP pools), as many texts as images (N pairs)."""
    if config.arch == "vit":
        return (_pixels(config, batch, device),), {}
    ids = _ids(config, batch, seq, device)
    if config.arch == "clip":
        if device != "meta":
            ids[:, -1] = config.eos_token_id
            ids[:, :-1] = ids[:, :-1] % config.eos_token_id  # no earlier end token
        return (), {"input_ids": ids, "pixel_values": _pixels(config, batch, device), "return_loss": True}
    if config.arch == "encoder-decoder":
        return (ids,), {"decoder_input_ids": _ids(config, batch, seq_dec or seq, device)}
    return (ids,), {}


def _outputs_sum(out):
    """What the runner's loss reaches: CLIP's contrastive loss, else the logits, else (an encoder with no head)
    the pooler's output or the last hidden state. A pooler beside a masked-token head gets no backward, as in
    training."""
    for t in (out.loss if out.logits_per_text is not None else None, out.logits, out.pooler_output,
              out.last_hidden_state):
        if t is not None:
            return t.float().sum()
    raise AssertionError("the model returned nothing")


def torch_flops(model, config, batch, seq, seq_dec=None, train=False, device="cpu") -> int:
    args, kwargs = _inputs(config, batch, seq, seq_dec, device)
    model.train(train)
    with torch.set_grad_enabled(train), FlopCounter() as fc:
        out = model(*args, **kwargs)
        if train:
            _outputs_sum(out).backward()
    return fc.get_total_flops()


def decode_step(model, config, batch, context, src_len=4):
    """Prefill ``context`` tokens, then count one new token's step. Returns (FLOPs, cache)."""
    model.eval()
    with torch.no_grad():
        if config.arch == "encoder-decoder":
            src = _ids(config, batch, src_len, "cpu")
            memory, _ = model.encode(src)
            cache = model.new_cache()
            if context:
                model(decoder_input_ids=_ids(config, batch, context, "cpu"), encoder_outputs=memory, past_key_values=cache)
            with FlopCounter() as fc:
                model(decoder_input_ids=_ids(config, batch, 1, "cpu"), encoder_outputs=memory, past_key_values=cache)
        else:
            cache = model.new_cache()
            if context:
                model(_ids(config, batch, context, "cpu"), past_key_values=cache)
            with FlopCounter() as fc:
                model(_ids(config, batch, 1, "cpu"), past_key_values=cache)
    return fc.get_total_flops(), cache


# Presets --------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("name", preset_names())
def test_preset_params_equal_numel(name):
    config = preset(name)
    model = build(config, device="meta")
    assert ledger(config, Workload(seq=8)).params["total"] == sum(p.numel() for p in model.parameters())


def _two_layers(config):
    """The preset with at most two layers per stack: every layer of a stack is the same, so the per-layer count is
    checked at the preset's real widths, heads and vocabulary at a fraction of the counting time (96 layers of
    gpt3-175b counted one by one took 8 s)."""
    fewer = {"n_layers": min(config.n_layers, 2)}
    if getattr(config, "n_decoder_layers", None):
        fewer["n_decoder_layers"] = min(config.n_decoder_layers, 2)
    try:
        return config.replace(**fewer)
    except TformerError:  # per-layer settings (a dilation per layer) tie the count to the preset's own depth
        return config


@pytest.mark.parametrize("name", preset_names())
def test_preset_flops_equal_flop_counter(name):
    config = _two_layers(preset(name))
    device = "cpu" if name in REAL_PRESETS else "meta"
    if config.position == "relative" and device == "meta":
        pytest.skip("relative bias masks need tensor values")
    model = build(config.replace(attn_impl="reference"), device=device)
    if device == "meta":
        _meta_safe(model)
    seq = 64 if device == "cpu" else min(256, config.max_positions)
    fwd = torch_flops(model, config, 1, seq, device=device)
    lg = ledger(config, Workload(phase="forward", batch=1, seq=seq))
    assert lg.flops["matmul"] == fwd
    if name != "t5-base":
        both = torch_flops(model, config, 1, seq, train=True, device=device)
        # 3x forward, less the pixels' gradient, which nothing asks for (the patch projection's weight alone)
        assert ledger(config, Workload(phase="train", batch=1, seq=seq)).flops["matmul"] == both == \
            3 * fwd - _pixel_grad_flops(lg)


def _pixel_grad_flops(lg) -> int:
    """The matmul FLOPs a gradient for the pixels would take: one forward's worth of each patch projection."""
    return sum(op.matmul_flops for op in lg.select(phase="forward", kind="patch_embed"))


def test_llama70b_meta_forward_and_backward_at_4096():
    config = preset("llama-70b")
    model = _meta_safe(build(config.replace(attn_impl="reference"), device="meta"))
    fwd = torch_flops(model, config, 1, 4096, device="meta")
    assert ledger(config, phase="forward", seq=4096).flops["matmul"] == fwd
    assert ledger(config, phase="train", seq=4096).flops["matmul"] == 3 * fwd


# Random configs ---------------------------------------------------------------------------------------------
@st.composite
def configs(draw):
    arch = draw(st.sampled_from(["decoder", "encoder", "encoder-decoder"]))
    position = draw(st.sampled_from(["learned", "sinusoidal", "rope", "alibi", "relative", "none"]))
    n_heads = draw(st.sampled_from([1, 2, 4]))
    kv = draw(st.sampled_from([d for d in (1, 2, 4) if n_heads % d == 0]))
    explicit_head = draw(st.booleans())
    head = draw(st.sampled_from([2, 4, 6]))
    d_model = draw(st.sampled_from([8, 12, 16])) if explicit_head else n_heads * head
    enc = arch == "encoder"
    data = dict(
        arch=arch, position=position, n_layers=draw(st.integers(1, 2)), d_model=d_model, n_heads=n_heads,
        n_kv_heads=kv if draw(st.booleans()) else None, head_dim=head if explicit_head else None,
        d_ff=draw(st.integers(3, 24)), vocab_size=draw(st.integers(5, 40)), max_positions=16,
        norm=draw(st.sampled_from(["layernorm", "rmsnorm"])), norm_placement=draw(st.sampled_from(["pre", "post"])),
        final_norm=draw(st.booleans()), embedding_norm=draw(st.booleans()),
        activation=draw(st.sampled_from(["relu", "gelu", "gelu_tanh", "silu"])), gated_mlp=draw(st.booleans()),
        bias=draw(st.booleans()), tied_embeddings=draw(st.booleans()), scale_embeddings=draw(st.booleans()),
        scale_attention=draw(st.booleans()),
        type_vocab_size=draw(st.integers(0, 3)) if enc else 0, pooler=draw(st.booleans()) if enc else False,
        lm_head=draw(st.booleans()) if enc else True,
        relative_attention_num_buckets=draw(st.integers(4, 8)),
        position_offset=draw(st.integers(0, 2)) if position == "learned" else 0,
    )
    if arch == "encoder-decoder":
        data.update(n_decoder_layers=draw(st.integers(1, 2)), rescale_tied_head=draw(st.booleans()),
                    final_logits_bias=draw(st.booleans()))
    return ModelConfig.from_dict(data)


@settings(max_examples=100, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(config=configs(), batch=st.integers(1, 2), seq=st.integers(1, 6), seq_dec=st.integers(1, 6))
def test_random_configs_match_torch(config, batch, seq, seq_dec):
    torch.manual_seed(0)
    model = build(config.replace(attn_impl="reference"))
    sd = seq_dec if config.arch == "encoder-decoder" else None
    assert ledger(config, seq=seq).params["total"] == sum(p.numel() for p in model.parameters())
    fwd = torch_flops(model, config, batch, seq, sd)
    assert ledger(config, phase="forward", batch=batch, seq=seq, seq_decoder=sd).flops["matmul"] == fwd
    both = torch_flops(model, config, batch, seq, sd, train=True)
    train = ledger(config, phase="train", batch=batch, seq=seq, seq_decoder=sd)
    # 3x forward, less the backward of what the loss never reaches (BERT's pooler under a masked-token head)
    unreached = sum(op.matmul_flops for op in train.select(phase="forward", kind="pooler")
                    if train.architecture.loss_skips)
    assert train.flops["matmul"] == both == 3 * fwd - 2 * unreached
    assert train.memory["gradients"] == 4 * sum(p.numel() for n, p in model.named_parameters()
                                                if not n.startswith(train.architecture.loss_skips))
    if config.has_decoder:
        context = seq - 1
        flops, cache = decode_step(model, config, batch, context, src_len=seq)
        lg = ledger(config, phase="decode", batch=batch, seq=seq, context=context)
        assert lg.flops["matmul"] == flops
        assert lg.memory["kv_cache"] == cache.nbytes


# Images: random ViT and CLIP configs -----------------------------------------------------------------------------
@st.composite
def image_configs(draw):
    """Tiny ViT or CLIP configs with odd widths, 1 or 3 channels, patch sizes 2-5 and an image a whole number of
    patches across (1-3 patches), with or without a classifier."""
    arch = draw(st.sampled_from(["vit", "clip"]))
    patch = draw(st.integers(2, 5))
    heads, head = draw(st.sampled_from([1, 2, 3])), draw(st.sampled_from([1, 3, 5]))
    data = dict(arch=arch, n_layers=draw(st.integers(1, 2)), d_model=heads * head, n_heads=heads,
                d_ff=draw(st.integers(3, 13)), patch_size=patch, image_size=patch * draw(st.integers(1, 3)),
                num_channels=draw(st.sampled_from([1, 3])), norm_placement=draw(st.sampled_from(["pre", "post"])),
                activation=draw(st.sampled_from(["gelu", "quick_gelu", "relu"])), bias=draw(st.booleans()))
    if arch == "vit":
        data.update(n_classes=draw(st.sampled_from([0, 1, 7])), patch_bias=draw(st.booleans()),
                    final_norm=draw(st.booleans()))
    else:
        v_heads = draw(st.sampled_from([1, 2]))
        vocab = draw(st.integers(5, 23))
        data.update(vocab_size=vocab, max_positions=8, eos_token_id=vocab - 1, pad_token_id=0, bos_token_id=0,
                    vision_n_layers=draw(st.integers(1, 2)), vision_n_heads=v_heads,
                    vision_d_model=v_heads * draw(st.sampled_from([3, 5])), vision_d_ff=draw(st.integers(3, 11)),
                    projection_dim=draw(st.integers(1, 9)))
    return ModelConfig.from_dict(data)


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(config=image_configs(), batch=st.integers(1, 3), seq=st.integers(1, 6))
def test_random_image_configs_match_torch(config, batch, seq):
    torch.manual_seed(0)
    model = build(config.replace(attn_impl="reference"))
    assert ledger(config, seq=seq).params["total"] == sum(p.numel() for p in model.parameters())
    fwd = torch_flops(model, config, batch, seq)
    lg = ledger(config, phase="forward", batch=batch, seq=seq)
    assert lg.flops["matmul"] == fwd
    both = torch_flops(model, config, batch, seq, train=True)
    train = ledger(config, phase="train", batch=batch, seq=seq)
    assert train.flops["matmul"] == both == 3 * fwd - _pixel_grad_flops(lg)
    assert train.memory["gradients"] == 4 * sum(p.numel() for p in model.parameters())


# KV cache ------------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("name,dtype,torch_dtype", [("char-small", "fp32", torch.float32), ("gpt2", "bf16", torch.bfloat16),
                                                    ("t5-small", "fp32", torch.float32)])
def test_kv_cache_equals_allocated(name, dtype, torch_dtype):
    config = preset(name)
    model = build(config, dtype=torch_dtype).eval()
    batch, seq = 2, 24
    ids = torch.randint(0, config.vocab_size, (batch, seq))
    with torch.no_grad():
        if config.arch == "encoder-decoder":
            src = torch.randint(0, config.vocab_size, (batch, 10))
            out = model(src, decoder_input_ids=ids, use_cache=True)
        else:
            out = model(ids, use_cache=True)
    lg = ledger(config, phase="prefill", batch=batch, seq=10 if config.arch == "encoder-decoder" else seq,
                seq_decoder=seq if config.arch == "encoder-decoder" else None, dtype=dtype)
    assert out.past_key_values.nbytes == lg.memory["kv_cache"] > 0


def test_kv_cache_grouped_query_after_decode_steps():
    config = preset("char-small", n_heads=8, n_kv_heads=2, position="rope")
    model = build(config).eval()
    cache = model.new_cache()
    with torch.no_grad():
        model(torch.randint(0, 65, (3, 7)), past_key_values=cache)
        for _ in range(3):
            model(torch.randint(0, 65, (3, 1)), past_key_values=cache)
    # 7 prompt tokens + 3 steps: the third step ran at context 9 and leaves 10 tokens cached.
    assert ledger(config, phase="decode", batch=3, seq=10, context=9).memory["kv_cache"] == cache.nbytes
