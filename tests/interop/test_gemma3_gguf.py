"""The real Gemma 3 270M from its GGUF file (Q4_K_M: Q5_0, Q4_K, Q6_K and Q8_0 blocks, F32 norms stored as 1 + w):
the config its metadata describes (with what llama.cpp fixes for the architecture), the norms undone, the K-quant
mix dequantized or kept matrix by matrix, and the logits and greedy continuations of transformers' GGUF loader (the reference)."""

from __future__ import annotations

import pytest
import torch

from tformer.cost.ledger import Workload, ledger
from tformer.interop.gguf_config import config_from_gguf
from tformer.interop.gguf_file import open_gguf
from tformer.interop.gguf_model import load_gguf
from tformer.interop.gguf_quants import dequantize

transformers = pytest.importorskip("transformers")

PROMPTS = ["The capital of France is", "def fibonacci(n):\n    ", "Once upon a time, in a small village,"]


@pytest.fixture(scope="module")
def gemma3(gemma3_path):
    return load_gguf(gemma3_path, tokenizer=True, weights="dequantize")


def test_the_config_is_the_files(gemma3_path):
    c = config_from_gguf(gemma3_path)
    assert (c.n_layers, c.d_model, c.n_heads, c.n_kv_heads, c.head_dim, c.d_ff, c.vocab_size) == (
        18, 640, 4, 1, 256, 2048, 262144)
    assert [i for i, t in enumerate(c.layer_types) if t == "full"] == [5, 11, 17] and c.attn_window == 512
    assert (c.rope_theta, c.rope_local_theta, c.attn_scale_dim, c.norm_eps, c.max_positions) == (
        1e6, 1e4, 256, 1e-6, 32768)
    assert (c.norm, c.norm_placement, c.qk_norm, c.activation, c.tied_embeddings) == (
        "rmsnorm_offset", "sandwich", True, "gelu_tanh", True)
    assert (c.bos_token_id, c.eos_token_id, c.pad_token_id) == (2, 1, 0)


def test_the_weights_are_the_files_with_the_norms_undone(gemma3, gemma3_path):
    model = gemma3[0]
    assert model.num_parameters() == 268_098_176  # google/gemma-3-270m
    with open_gguf(gemma3_path) as f:
        for name, ours in (("blk.3.attn_q_norm.weight", "decoder.layers.3.attn.q_norm.weight"),
                           ("blk.3.post_ffw_norm.weight", "decoder.layers.3.mlp_post_norm.weight"),
                           ("output_norm.weight", "decoder.final_norm.weight"),
                           ("blk.3.ffn_down.weight", "decoder.layers.3.mlp.down.weight")):
            info = f.tensors[name]
            want = dequantize(f.raw(name), info.ggml_type, info.shape)
            if name.endswith("norm.weight"):
                want = want - 1.0
            assert torch.equal(model.state_dict()[ours], want), name


def test_its_block_mix_is_kept_matrix_by_matrix_and_widens_to_the_dequantized_model(gemma3_path, gemma3):
    """The Q4_K_M mix kept (quantize='mixed'): every layer Linear in its tensor's own format holding the file's
    bytes, the head the Q8_0 token table (and the lookup's); on the widening path the logits are the dequantized
    model's exactly."""
    from tformer.model.quantized import QuantizedLinear, quantized_path

    kept = load_gguf(gemma3_path, weights="keep")
    c = kept.config
    assert (c.quantize, c.quantize_head, len(c.quantize_layers)) == ("mixed", "q8_0", 18)
    with open_gguf(gemma3_path) as f:
        for i in range(18):
            for gguf_name, ours in (("attn_q", "attn.q_proj"), ("attn_v", "attn.v_proj"), ("attn_output", "attn.o_proj"),
                                    ("ffn_down", "mlp.down")):
                name = f"blk.{i}.{gguf_name}.weight"
                module = kept.get_submodule(f"decoder.layers.{i}.{ours}")
                assert isinstance(module, QuantizedLinear) and module.layout == f.tensors[name].ggml_type.lower()
                if module.layout != "q8_0":
                    assert module.blocks.numpy().tobytes() == f.raw(name).tobytes(), name
    assert kept.num_parameters() == 268_098_176
    # the Q8_0 token table is the head's and the lookup's: the model holds about the file's bytes (253 MB), not
    # the 671 MB fp32 table beside them, and the ledger says so to the byte
    stored = sum(t.numel() * t.element_size() for t in kept.state_dict().values())
    assert kept.tok_embed is None and stored < 253_113_024
    assert stored == ledger(c, Workload(phase="decode", batch=1, seq=9, context=8)).memory["weights"]
    ids = torch.tensor([gemma3[1].encode("The capital of France is")])
    with torch.no_grad(), quantized_path(kept, "reference"):
        assert torch.equal(kept(ids).logits, gemma3[0](ids).logits)


def test_a_prompt_starts_with_bos_where_the_file_says_so(gemma3):
    """Gemma's file adds BOS (llama.cpp prompts with it); without it the base model reads the prompt as the middle
    of a document. SmolLM2's file does not add one (tested with its tokenizer)."""
    from tformer.generate.search import prompt_ids

    tok = gemma3[1]
    assert tok.add_bos and prompt_ids(tok, "The capital of France is") == [2, *tok.encode("The capital of France is")]


@pytest.fixture(scope="module")
def reference(gemma3_path):
    model = transformers.AutoModelForCausalLM.from_pretrained(
        gemma3_path.parent, gguf_file=gemma3_path.name, dtype=torch.float32).eval()
    return model


@pytest.mark.slow
def test_logits_equal_transformers_gguf_loader(gemma3, reference, gemma3_path):
    """Within fp32's own rounding: on logits up to 25 after 18 layers, transformers' two attention paths (sdpa, the
    default, and eager) differ from each other by up to 2.4e-4 here, and ours from its sdpa by up to 1.9e-4. So the
    bound is transformers' own eager-vs-sdpa spread on the same prompt, and the top token is the same everywhere."""
    ours, tok = gemma3
    eager = transformers.AutoModelForCausalLM.from_pretrained(
        gemma3_path.parent, gguf_file=gemma3_path.name, dtype=torch.float32, attn_implementation="eager").eval()
    for prompt in PROMPTS:
        ids = torch.tensor([tok.encode(prompt)])
        with torch.no_grad():
            a, b, c = ours(ids).logits, reference(ids).logits, eager(ids).logits
        spread = max((b - c).abs().max().item(), 1e-4)
        assert (a - b).abs().max().item() <= spread and (a - c).abs().max().item() <= spread, prompt
        assert torch.equal(a.argmax(-1), b.argmax(-1)), prompt


@pytest.mark.slow
def test_greedy_continuations_equal_transformers(gemma3, reference):
    from tformer.generate import generate

    ours, tok = gemma3
    for prompt in PROMPTS[:2]:
        ids = tok.encode(prompt)
        with torch.no_grad():
            want = reference.generate(torch.tensor([ids]), max_new_tokens=16, do_sample=False, eos_token_id=None,
                                      pad_token_id=0)[0, len(ids):].tolist()
        assert generate(ours, [ids], max_new_tokens=16, stop_tokens=[]).sequences[0] == want, prompt
