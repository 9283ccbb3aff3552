"""RoPE scaling equals Hugging Face LLaMA's ``rope_scaling`` (linear, dynamic, yarn, llama3) and reaches past
the trained context; static NTK has no HF type and is checked against its formula.

Each reference is a tiny random LlamaForCausalLM with odd sizes (3 query heads, 1 key/value head,
head_dim 12, vocab 97), perturbed, saved and loaded with tformer.load_hf; logits must agree within
1e-5 on 40 tokens, past the 16 positions the scaling counts from.
"""

from __future__ import annotations

import math

import pytest
import torch

import tformer
from tformer.core.config import ModelConfig
from tformer.core.errors import TformerError
from tformer.interop.hf_config import config_from_hf, config_to_hf
from tformer.model.position import RopeScaling, rope_cos_sin, rope_inv_freq, yarn_attention_factor

transformers = pytest.importorskip("transformers")
transformers.logging.set_verbosity_error()

TOL = 1e-5
VOCAB, ORIGINAL, LONG = 97, 16, 40

CASES = {
    "linear": (16, {"rope_type": "linear", "factor": 2.5}),
    "dynamic": (16, {"rope_type": "dynamic", "factor": 2.0}),
    "yarn": (64, {"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": ORIGINAL}),
    # A small theta spreads the ramp over several feature pairs; explicit betas and cos/sin scale.
    "yarn-ramp": (64, {"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": ORIGINAL,
                       "rope_theta": 100.0, "beta_fast": 4.0, "beta_slow": 0.5, "attention_factor": 1.2}),
    # DeepSeek-style: the cos/sin scale is a ratio of two mscales, and the file gives no original length.
    "yarn-mscale": (64, {"rope_type": "yarn", "factor": 4.0, "mscale": 1.0, "mscale_all_dim": 0.5}),
    # Llama 3.1's: a large theta and an original context that puts pairs in all three bands (kept, blended, stretched)
    # (wavelengths 6.3, 17.7, 49.9, 140.5, ...: under 64 / 4, between, over 64)
    "llama3": (128, {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
                     "original_max_position_embeddings": 64, "rope_theta": 500.0}),
}


def reference(max_positions: int, rope: dict, seed: int = 0):
    rope = {"rope_theta": 10000.0, **rope}
    config = transformers.LlamaConfig(
        num_hidden_layers=2, hidden_size=36, num_attention_heads=3, num_key_value_heads=1, intermediate_size=50,
        vocab_size=VOCAB, max_position_embeddings=max_positions, rms_norm_eps=1e-6, tie_word_embeddings=False,
        rope_parameters=rope)
    torch.manual_seed(seed)
    model = transformers.LlamaForCausalLM._from_config(config, attn_implementation="eager").eval()
    with torch.no_grad():
        for p in model.parameters():
            p.add_(torch.randn_like(p) * 0.05)
    return model


def ids(n: int = LONG, batch: int = 2) -> torch.Tensor:
    return torch.randint(3, VOCAB, (batch, n), generator=torch.Generator().manual_seed(1))


@pytest.fixture(scope="module")
def pairs(tmp_path_factory):
    """case -> (HF reference, ours loaded from its save_pretrained folder)."""
    out = {}
    for name, (max_positions, rope) in CASES.items():
        ref = reference(max_positions, rope)
        path = tmp_path_factory.mktemp(name)
        ref.save_pretrained(path)
        out[name] = (ref, tformer.load_hf(path))
    return out


def logits_diff(ours, ref, x: torch.Tensor) -> float:
    with torch.no_grad():
        return (ours(x).logits - ref(x).logits).abs().max().item()


@pytest.mark.parametrize("name", list(CASES))
def test_logits_match_hf_past_the_original_length(pairs, name):
    ref, ours = pairs[name]
    assert ours.config.rope_scaling == CASES[name][1]["rope_type"]
    diff = logits_diff(ours, ref, ids())
    print(f"{name}: max|diff| = {diff:.2e}")
    assert diff <= TOL


def test_dynamic_matches_at_every_length_and_only_rescales_past_the_original(pairs):
    ref, ours = pairs["dynamic"]
    for n in (8, ORIGINAL, ORIGINAL + 1, 25, 33):  # HF grows its cached base; rising lengths keep it in step
        assert logits_diff(ours, ref, ids(n)) <= TOL, n
    plain = ours.config.replace(rope_scaling="none")
    unscaled = tformer.build_model(plain).eval()
    unscaled.load_state_dict(ours.state_dict())
    with torch.no_grad():
        assert torch.allclose(unscaled(ids(ORIGINAL)).logits, ours(ids(ORIGINAL)).logits, atol=1e-6)
        assert not torch.allclose(unscaled(ids(ORIGINAL + 8)).logits, ours(ids(ORIGINAL + 8)).logits, atol=1e-3)


def test_dynamic_cached_decode_equals_hf_generate(pairs):
    """HF recomputes the base from the longest position each forward; in cached decoding the new
    token's query and key use the base for the length so far while cached keys keep theirs. Ours
    does the same, so the greedy tokens and every step's logits equal HF's generate (and both differ
    from re-running the whole sequence, which rotates every key with the latest base)."""
    ref, ours = pairs["dynamic"]
    prompt, new = ids(12, batch=1), 20  # starts inside the original 16 positions and decodes past them
    with torch.no_grad():
        hf = ref.generate(prompt, max_new_tokens=new, min_new_tokens=new, do_sample=False, use_cache=True,
                          return_dict_in_generate=True, output_logits=True, pad_token_id=0)
        cache = ours.new_cache()
        logits = ours(prompt, past_key_values=cache).logits[:, -1]
        tokens, steps = [], [logits]
        for _ in range(new - 1):
            tokens.append(logits.argmax(-1))
            logits = ours(tokens[-1][:, None], past_key_values=cache).logits[:, -1]
            steps.append(logits)
        tokens.append(logits.argmax(-1))
        full = ours(torch.cat([prompt, torch.stack(tokens[:-1], 1)], 1)).logits[:, -1]
    assert torch.equal(torch.stack(tokens, 1), hf.sequences[:, prompt.shape[1]:])
    assert max((a - b).abs().max().item() for a, b in zip(steps, hf.logits)) <= TOL
    assert (full - steps[-1]).abs().max().item() > 1e-4


@pytest.mark.parametrize("name", list(CASES))
def test_save_hf_reloads_in_transformers_with_the_same_logits(pairs, tmp_path, name):
    ref, ours = pairs[name]
    tformer.save_hf(ours, tmp_path)
    back = transformers.AutoModelForCausalLM.from_pretrained(tmp_path, attn_implementation="eager").eval()
    assert back.config.rope_parameters["rope_type"] == CASES[name][1]["rope_type"]
    assert logits_diff(ours, back, ids()) <= TOL
    assert tformer.load_hf(tmp_path).config == ours.config


NATIVE = dict(arch="decoder", n_layers=2, d_model=36, n_heads=3, n_kv_heads=1, d_ff=50, vocab_size=VOCAB,
              max_positions=32, position="rope", norm="rmsnorm", norm_eps=1e-6, gated_mlp=True, activation="silu",
              bias=False, tied_embeddings=False)


@pytest.mark.parametrize("fields", [
    dict(rope_scaling="linear", rope_factor=3.0, rope_original_positions=32),  # unused by linear: still saves
    dict(rope_scaling="dynamic", rope_factor=2.0, rope_original_positions=32),  # = max_positions, HF's count
    dict(rope_scaling="yarn", rope_factor=8.0, rope_original_positions=8, rope_beta_fast=16.0, rope_beta_slow=2.0),
    dict(rope_scaling="yarn", rope_factor=2.0, rope_attention_factor=0.9),
], ids=["linear", "dynamic", "yarn", "yarn-default-original"])
def test_native_scaled_models_save_to_hf_and_back(tmp_path, fields):
    torch.manual_seed(0)
    ours = tformer.build_model(ModelConfig(**NATIVE, **fields)).eval()
    tformer.save_hf(ours, tmp_path)
    back = transformers.AutoModelForCausalLM.from_pretrained(tmp_path, attn_implementation="eager").eval()
    assert logits_diff(ours, back, ids(48)) <= TOL
    assert logits_diff(ours, tformer.load_hf(tmp_path), ids(48)) == 0.0


def test_dynamic_counting_from_another_length_cannot_be_saved():
    config = ModelConfig(**NATIVE, rope_scaling="dynamic", rope_factor=2.0, rope_original_positions=16)
    with pytest.raises(TformerError, match="rope_original_positions=16"):
        config_to_hf(config)


def test_static_ntk_has_no_hf_type():
    with pytest.raises(TformerError, match="rope_scaling='ntk' has no Hugging Face rope_type"):
        config_to_hf(ModelConfig(**NATIVE, rope_scaling="ntk", rope_factor=4.0))


@pytest.mark.parametrize("kind", ["longrope", "su"])
def test_unsupported_hf_rope_types_are_refused_in_one_line(kind):
    d = dict(model_type="llama", num_hidden_layers=1, hidden_size=16, num_attention_heads=2, intermediate_size=32,
             vocab_size=20, rope_scaling={"rope_type": kind, "factor": 8.0})
    with pytest.raises(TformerError) as err:
        config_from_hf(d)
    assert f"rope_type='{kind}'" in str(err.value) and "default, linear, dynamic, yarn, llama3" in str(err.value)
    assert "\n" not in str(err.value)


def test_hf_rope_dict_maps_onto_our_fields():
    base = dict(model_type="llama", num_hidden_layers=1, hidden_size=16, num_attention_heads=2,
                intermediate_size=32, vocab_size=20, max_position_embeddings=4096)
    old_style = config_from_hf({**base, "rope_theta": 500.0, "rope_scaling": {"type": "linear", "factor": 2}})
    assert (old_style.rope_scaling, old_style.rope_factor, old_style.rope_theta) == ("linear", 2.0, 500.0)
    yarn = config_from_hf({**base, "rope_parameters": {"rope_type": "yarn", "factor": 4.0, "rope_theta": 1e6,
                                                      "original_max_position_embeddings": 1024}})
    assert (yarn.rope_original_positions, yarn.rope_beta_fast, yarn.rope_beta_slow) == (1024, 32.0, 1.0)
    assert yarn.rope_attention_factor is None and yarn.rope_theta == 1e6
    implicit = config_from_hf({**base, "rope_scaling": {"rope_type": "yarn", "original_max_position_embeddings": 512}})
    assert implicit.rope_factor == 8.0  # HF: max_position_embeddings / original when factor is absent
    with pytest.raises(TformerError, match="truncate=false"):
        config_from_hf({**base, "rope_scaling": {"rope_type": "yarn", "factor": 2.0, "truncate": False}})


# The formulas, independent of Hugging Face ------------------------------------------------------
D, THETA = 16, 10000.0


def test_linear_interpolation_divides_the_positions():
    pos = torch.arange(50)[None]
    scaled = rope_cos_sin(pos, D, THETA, torch.float64, RopeScaling("linear", 4.0))
    plain = rope_cos_sin(pos.float() / 4.0, D, THETA, torch.float64)
    assert all(torch.allclose(a, b, atol=1e-6) for a, b in zip(scaled, plain))


def test_static_ntk_is_theta_times_factor_to_the_d_over_d_minus_2():
    factor = 4.0
    inv_freq, scale = rope_inv_freq(D, THETA, RopeScaling("ntk", factor))
    new_theta = THETA * factor ** (D / (D - 2))
    expected = torch.tensor([new_theta ** (-2 * i / D) for i in range(D // 2)], dtype=torch.float64)
    assert scale == 1.0 and torch.allclose(inv_freq.double(), expected, rtol=1e-6)
    plain, _ = rope_inv_freq(D, THETA)
    # NTK-aware: the fastest pair keeps its frequency, the slowest is interpolated exactly by the factor.
    assert inv_freq[0] == plain[0] and math.isclose(inv_freq[-1] / plain[-1], 1 / factor, rel_tol=1e-5)


def test_dynamic_base_grows_only_past_the_original_length():
    s = RopeScaling("dynamic", 2.0, original_positions=100)
    plain, _ = rope_inv_freq(D, THETA)
    assert torch.equal(rope_inv_freq(D, THETA, s, seq_len=100)[0], plain)
    grown, _ = rope_inv_freq(D, THETA, s, seq_len=300)
    base = THETA * (2.0 * 300 / 100 - 1) ** (D / (D - 2))
    assert math.isclose(grown[1].item(), base ** (-2 / D), rel_tol=1e-5)


def test_yarn_keeps_fast_pairs_interpolates_slow_ones_and_scales_cos_sin():
    s = RopeScaling("yarn", 4.0, original_positions=64, beta_fast=8.0, beta_slow=1.0)
    inv_freq, scale = rope_inv_freq(D, 100.0, s)
    plain, _ = rope_inv_freq(D, 100.0)
    ratio = inv_freq / plain
    assert ratio[0] == 1.0 and math.isclose(ratio[-1].item(), 0.25, rel_tol=1e-6)
    assert ((ratio > 0.25 + 1e-6) & (ratio < 1 - 1e-6)).any()  # blended pairs on the ramp
    assert torch.all(ratio[1:] <= ratio[:-1])  # slower pairs are interpolated at least as much
    assert scale == pytest.approx(0.1 * math.log(4.0) + 1) == yarn_attention_factor(4.0)
    cos, sin = rope_cos_sin(torch.arange(10)[None], D, 100.0, torch.float32, s)
    assert torch.allclose(cos**2 + sin**2, torch.full_like(cos, scale**2), atol=1e-5)


def test_rope_scaling_config_checks():
    with pytest.raises(TformerError, match="rope_beta_fast=1.0 is below rope_beta_slow=2.0"):
        ModelConfig(**NATIVE, rope_scaling="yarn", rope_factor=2.0, rope_beta_fast=1.0, rope_beta_slow=2.0)
    with pytest.raises(TformerError, match="needs position='rope'"):
        ModelConfig(**{**NATIVE, "position": "learned"}, rope_scaling="linear", rope_factor=2.0)
    with pytest.raises(TformerError, match="needs 0 < low < high"):
        ModelConfig(**NATIVE, rope_scaling="llama3", rope_factor=8.0, rope_low_freq_factor=4.0,
                    rope_high_freq_factor=1.0)


def test_llama3_keeps_fast_pairs_stretches_slow_ones_and_blends_between():
    """Against the rule written out: wavelength under original / high kept, over original / low divided by factor,
    and between 1 / divisor = (1 - s) / factor + s with s = (original / wavelength - low) / (high - low)."""
    s = RopeScaling("llama3", 8.0, 64, low_freq_factor=1.0, high_freq_factor=4.0)
    inv, scale = rope_inv_freq(12, 500.0, s)
    plain, _ = rope_inv_freq(12, 500.0)
    wavelength = 2 * math.pi / plain
    assert scale == 1.0
    for w, got, base in zip(wavelength.tolist(), inv.tolist(), plain.tolist()):
        if w < 16:
            assert got == pytest.approx(base)
        elif w > 64:
            assert got == pytest.approx(base / 8.0)
        else:
            blend = (64 / w - 1.0) / (4.0 - 1.0)
            assert got == pytest.approx(base * ((1 - blend) / 8.0 + blend), rel=1e-6)
