"""A real model from its GGUF file: SmolLM2-135M-Instruct (Q4_1 matrices, Q8_0 embedding) loads into tformer
with the config its metadata describes, and gives the logits of transformers' GGUF loader (the reference:
it dequantizes to fp32 with gguf-py), and the same greedy continuations. Synthetic files cover the
permutation and the refusals."""

from __future__ import annotations

import re

import numpy as np
import pytest
import torch

from tformer.core.errors import TformerError
from tformer.interop.gguf_config import hf_config_from_gguf, resolve_gguf
from tformer.interop.gguf_file import open_gguf
from tformer.interop.gguf_model import load_gguf, unpermute

gguf = pytest.importorskip("gguf")
transformers = pytest.importorskip("transformers")

PROMPTS = ["The capital of France is", "def fibonacci(n):\n    ", "Once upon a time, in a small village,",
           "Water boils at a temperature of", "The three primary colours are"]


@pytest.fixture(scope="module")
def real(smollm2, smollm2_hf):
    return smollm2[0], smollm2_hf[0], smollm2_hf[1]


def test_the_config_is_the_files(real):
    c = real[0].config
    assert (c.n_layers, c.d_model, c.n_heads, c.n_kv_heads, c.d_ff, c.vocab_size) == (30, 576, 9, 3, 1536, 49152)
    assert c.position == "rope" and c.rope_theta == 100000.0 and c.norm_eps == 1e-5 and c.tied_embeddings
    assert (c.bos_token_id, c.eos_token_id, c.pad_token_id) == (1, 2, 2)
    assert real[0].num_parameters() == 134_515_008


def test_logits_equal_transformers_gguf_loader(real):
    ours, ref, tok = real
    for prompt in PROMPTS:
        ids = torch.tensor([tok(prompt)["input_ids"]])
        with torch.no_grad():
            a, b = ours(ids).logits, ref(ids).logits
        assert (a - b).abs().max().item() < 1e-4, prompt


def test_greedy_continuations_equal_transformers(real):
    from tformer.generate import generate

    ours, ref, tok = real
    for prompt in PROMPTS[:3]:
        ids = tok(prompt)["input_ids"]
        with torch.no_grad():
            want = ref.generate(torch.tensor([ids]), max_new_tokens=24, do_sample=False, eos_token_id=None,
                                pad_token_id=2)[0, len(ids):].tolist()
        got = generate(ours, [ids], max_new_tokens=24, stop_tokens=[]).sequences[0]
        assert got == want, prompt


def test_kept_blocks_are_the_files_bytes(smollm2_kept, smollm2, smollm2_path):
    """Q4_1 layers and the Q8_0 head (the token table's blocks: the file ties them) hold the file's blocks: as many
    bytes, and widened they are the dequantized weights exactly, Q and K rows unpermuted alike."""
    kept = smollm2_kept
    assert (kept.config.quantize, kept.config.quantize_head) == ("q4_1", "q8_0")
    with open_gguf(smollm2_path) as f:
        for gguf_name, module in (("blk.3.attn_q.weight", "decoder.layers.3.attn.q_proj"),
                                  ("blk.3.ffn_down.weight", "decoder.layers.3.mlp.down"),
                                  ("token_embd.weight", "lm_head")):
            m = kept.get_submodule(module)
            # what the module stores (its state: the block kernel's repacked copy, where a test before this one
            # ran it, is a derived buffer, not saved)
            stored = m.state_dict().values()
            assert sum(b.numel() * b.element_size() for b in stored) == f.tensors[gguf_name].nbytes
    dense = dict(smollm2[0].named_parameters())
    for module in ("decoder.layers.3.attn.q_proj", "decoder.layers.3.attn.k_proj", "decoder.layers.29.mlp.up",
                   "lm_head"):
        want = dense["tok_embed.weight" if module == "lm_head" else f"{module}.weight"]
        assert torch.equal(kept.get_submodule(module).dequantized(), want), module


def _wikitext_chunks(tok, chunks=2, ctx=512):
    from tformer.data.corpora import get_corpus

    ids = tok.encode(get_corpus("wikitext2").text("test")[:40_000])
    return torch.tensor(ids[:chunks * ctx]).view(chunks, ctx)


def test_kept_blocks_agree_with_the_dequantized_model(smollm2, smollm2_kept):
    """Against the dequantized model on WikiText-2's test text: through its widening path (the same weights, the same
    products) the kept model gives the dequantized model's logits exactly, on the same 128 tokens; through torch's
    int4 kernel, which rounds inputs and scales to bf16, the same next token on >= 97.5% of 1,024 (measured: 98.0%;
    llama.cpp rounds its inputs coarser still, to 8-bit blocks: its own Q4_1-vs-f32 agreement, 96.5%, is in
    bench/llamacpp.py's record)."""
    from tformer.model.quantized import kernels, quantized_path

    dense, tok = smollm2
    ids = _wikitext_chunks(tok)
    short = ids[:1, :128]  # the widening path computes the same weights: a short check of its logits suffices
    with torch.no_grad():
        assert torch.equal(smollm2_kept(short).logits, dense(short).logits)
        want = dense(ids).logits
    if kernels()[4]:
        with torch.no_grad(), quantized_path(smollm2_kept, "kernel"):
            agree = (smollm2_kept(ids).logits.argmax(-1) == want.argmax(-1)).float().mean().item()
        assert agree >= 0.975, agree


def _tiny_file(tmp_path, arch="llama", extra=None, drop=()):
    """A 2-layer llama GGUF written with gguf-py (the format's own writer), random F32 weights."""
    torch.manual_seed(0)
    heads, kv, d, ff, vocab = 4, 2, 16, 24, 40
    w = gguf.GGUFWriter(str(tmp_path / "tiny.gguf"), arch)
    meta = {"block_count": 2, "embedding_length": d, "feed_forward_length": ff, "attention.head_count": heads,
            "attention.head_count_kv": kv, "context_length": 64}
    for key, value in meta.items():
        if key not in drop:
            w.add_uint32(f"{arch}.{key}", value)
    w.add_float32(f"{arch}.attention.layer_norm_rms_epsilon", 1e-5)
    w.add_float32(f"{arch}.rope.freq_base", 10000.0)
    for key, value in (extra or {}).items():
        w.add_uint32(key, value)
    tensors = {"token_embd.weight": (vocab, d), "output_norm.weight": (d,)}
    for i in range(2):
        tensors.update({f"blk.{i}.attn_norm.weight": (d,), f"blk.{i}.attn_q.weight": (d, d),
                        f"blk.{i}.attn_k.weight": (kv * d // heads, d), f"blk.{i}.attn_v.weight": (kv * d // heads, d),
                        f"blk.{i}.attn_output.weight": (d, d), f"blk.{i}.ffn_norm.weight": (d,),
                        f"blk.{i}.ffn_gate.weight": (ff, d), f"blk.{i}.ffn_up.weight": (ff, d),
                        f"blk.{i}.ffn_down.weight": (d, ff)})
    values = {name: torch.randn(shape) for name, shape in tensors.items()}
    for name, t in values.items():
        w.add_tensor(name, t.numpy())
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return tmp_path / "tiny.gguf", values


def test_q_and_k_rows_come_back_in_hugging_face_order(tmp_path):
    """llama.cpp's converter permutes Q/K rows (pairs); unpermute is its inverse, row for row."""
    heads, hd, d = 3, 8, 5
    hf = torch.arange(heads * hd * d, dtype=torch.float32).reshape(heads * hd, d)
    llama_cpp = hf.reshape(heads, 2, hd // 2, d).swapaxes(1, 2).reshape(heads * hd, d)
    assert torch.equal(unpermute(llama_cpp, heads), hf)
    path, values = _tiny_file(tmp_path)
    model = load_gguf(path)
    q = model.decoder.layers[0].attn.q_proj.weight
    assert torch.equal(q, unpermute(values["blk.0.attn_q.weight"], 4))
    assert model.config.tied_embeddings  # no output.weight in the file


@pytest.mark.parametrize("change,words", [
    ({"arch": "falcon"}, "holds a 'falcon' model; tformer reads: llama"),
    ({"drop": ("attention.head_count",)}, "lacks the metadata key llama.attention.head_count"),
    ({"extra": {"tokenizer.ggml.bos_token_id": 999}}, "outside the vocabulary"),
])
def test_bad_metadata_is_one_line(tmp_path, change, words):
    path, _ = _tiny_file(tmp_path, **change)
    with pytest.raises(TformerError, match=words) as err:
        with open_gguf(path) as f:
            hf_config_from_gguf(f)
    assert "\n" not in str(err.value)


def test_an_unknown_name_or_path_is_one_line(tmp_path):
    with pytest.raises(TformerError, match="not a packaged model") as err:
        resolve_gguf(tmp_path / "missing.gguf")
    assert "smollm2-135m-instruct" in str(err.value)


def _random_k_blocks(shape, ggml_type: str) -> np.ndarray:
    """Random bytes of a Q4_K or Q6_K tensor whose fp16 super-block scales are small and finite (no encoder of
    ours involved: the reference is gguf-py's reading of the same bytes)."""
    per, size = gguf.GGML_QUANT_SIZES[gguf.GGMLQuantizationType[ggml_type]]
    blocks = np.random.default_rng(abs(hash(shape)) % 1000).integers(0, 256, (shape[0] * shape[1] // per, size),
                                                                     dtype=np.uint8)
    scales = np.random.default_rng(3).uniform(1e-3, 5e-3, (blocks.shape[0], 2)).astype(np.float16).view(np.uint8)
    if ggml_type == "Q6_K":
        blocks[:, 208:210] = scales[:, :2]
    else:
        blocks[:, 0:4] = scales
    return blocks.reshape(shape[0], -1)


def _blocks_file(tmp_path, layer_types: dict[str, str], embd="Q8_0", d=32, ff=64):
    """A 2-layer llama GGUF (widths whole blocks) whose matrices gguf-py quantizes to the given types (Q4_K and
    Q6_K, which gguf-py does not write: random blocks)."""
    torch.manual_seed(1)
    heads, kv, vocab = 4, 2, 40
    w = gguf.GGUFWriter(str(tmp_path / "blocks.gguf"), "llama")
    for key, value in {"block_count": 2, "embedding_length": d, "feed_forward_length": ff,
                       "attention.head_count": heads, "attention.head_count_kv": kv, "context_length": 64}.items():
        w.add_uint32(f"llama.{key}", value)
    w.add_float32("llama.attention.layer_norm_rms_epsilon", 1e-5)
    w.add_float32("llama.rope.freq_base", 10000.0)

    def add(name, shape, ggml_type="F32"):
        t = (torch.randn(shape) * 0.2).numpy()
        if ggml_type == "F32":
            w.add_tensor(name, t)
        elif ggml_type in ("Q4_K", "Q6_K"):
            w.add_tensor(name, _random_k_blocks(shape, ggml_type), raw_dtype=gguf.GGMLQuantizationType[ggml_type])
        else:
            kind = gguf.GGMLQuantizationType[ggml_type]
            w.add_tensor(name, gguf.quants.quantize(t, kind), raw_dtype=kind)
    add("token_embd.weight", (vocab, d), embd)
    add("output_norm.weight", (d,))
    for i in range(2):
        add(f"blk.{i}.attn_norm.weight", (d,))
        add(f"blk.{i}.ffn_norm.weight", (d,))
        for name, shape in (("attn_q", (d, d)), ("attn_k", (kv * d // heads, d)), ("attn_v", (kv * d // heads, d)),
                            ("attn_output", (d, d)), ("ffn_gate", (ff, d)), ("ffn_up", (ff, d)), ("ffn_down", (d, ff))):
            add(f"blk.{i}.{name}.weight", shape, layer_types.get(name, layer_types.get("*", "F32")))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return tmp_path / "blocks.gguf"


@pytest.mark.parametrize("layers,embd,want", [("Q4_1", "Q8_0", ("q4_1", "q8_0")), ("Q8_0", "Q8_0", ("q8_0", "q8_0")),
                                              ("Q4_1", "F32", ("q4_1", "none")), ("F32", "Q4_1", ("none", "q4_1"))])
def test_kept_blocks_compute_the_dequantized_model(tmp_path, layers, embd, want):
    """Blocks gguf-py wrote, kept: the config names them, and widened they give the dequantized model's logits."""
    from tformer.model.quantized import QuantizedLinear

    path = _blocks_file(tmp_path, {"*": layers}, embd)
    kept, dense = load_gguf(path, weights="keep"), load_gguf(path, weights="dequantize")
    assert (kept.config.quantize, kept.config.quantize_head) == want
    assert (dense.config.quantize, dense.config.quantize_head) == ("none", "none")
    for m in kept.modules():
        if isinstance(m, QuantizedLinear):
            m.path = "reference"
    ids = torch.tensor([[1, 5, 7, 30, 2, 11]])
    with torch.no_grad():
        assert torch.allclose(kept(ids).logits, dense(ids).logits, rtol=0, atol=1e-5)


# Each matrix in its own format, as llama.cpp's Q4_K_M mixes them (Gemma 3's file: Q5_0, Q8_0, Q4_K, Q6_K).
_MIX = {"*": "Q5_0", "attn_v": "Q8_0", "attn_output": "Q4_K", "ffn_down": "Q6_K"}


def test_a_file_mixing_block_types_keeps_each_matrix_in_its_own(tmp_path):
    """quantize='mixed': every Linear holds its tensor's bytes as the file has them, and widened the model gives
    the dequantized model's logits; the forced kernel (Q6_K has none: the reference) stays within bf16."""
    from tformer.model.quantized import quantized_path

    path = _blocks_file(tmp_path, _MIX, d=256, ff=512)
    kept, dense = load_gguf(path, weights="keep"), load_gguf(path, weights="dequantize")
    c = kept.config
    assert (c.quantize, c.quantize_head) == ("mixed", "q8_0")
    assert c.quantize_layers == ["q:q5_0,k:q5_0,v:q8_0,o:q4_k,gate:q5_0,up:q5_0,down:q6_k"] * 2
    tensors = {t.name: t for t in gguf.GGUFReader(str(path)).tensors}  # gguf-py's reading of the bytes
    for layer in range(2):
        for gguf_name, ours in (("attn_output", "attn.o_proj"), ("ffn_down", "mlp.down"), ("ffn_up", "mlp.up")):
            raw = tensors[f"blk.{layer}.{gguf_name}.weight"].data
            stored = kept.get_submodule(f"decoder.layers.{layer}.{ours}").blocks
            assert stored.numpy().tobytes() == np.asarray(raw).tobytes()
    ids = torch.tensor([[1, 5, 7, 30, 2, 11]])
    with torch.no_grad(), quantized_path(kept, "reference"):
        assert torch.equal(kept(ids).logits, dense(ids).logits)
    with torch.no_grad(), quantized_path(kept, "kernel"):
        kernel = kept(ids).logits
    ref = dense(ids).logits.detach()
    assert (kernel - ref).abs().max() < 0.02 * ref.abs().max()


@pytest.mark.parametrize("types,words", [({"*": "Q4_0"}, "holds its layers' matrices as Q4_0 (blk.0.attn_q.weight); "
                                                         "tformer keeps Q8_0, Q4_1, Q5_0, Q4_K, Q6_K"),
                                         ({"*": "Q4_1", "ffn_down": "Q5_1"}, "holds its layers' matrices as Q5_1")])
def test_blocks_tformer_cannot_keep_are_one_line_with_the_way_out(tmp_path, types, words):
    path = _blocks_file(tmp_path, types)
    with pytest.raises(TformerError, match=re.escape(words)) as err:
        load_gguf(path, weights="keep")
    assert "--gguf-weights dequantize" in str(err.value) and "\n" not in str(err.value)
    assert load_gguf(path, weights="dequantize").config.quantize == "none"


def test_finetune_starts_from_a_gguf_file(tmp_path):
    """`tformer finetune --gguf FILE`: the file's weights (dequantized, Q/K unpermuted) under a new task head."""
    from tformer.model import build
    from tformer.train.finetune import _load_origin, finetune_config, resolve_origin

    path, values = _tiny_file(tmp_path)
    origin = resolve_origin(str(path))
    assert origin.kind == "gguf"
    model = build(finetune_config(origin, "sequence-classification", 2, "last", []))
    assert _load_origin(model, origin)  # the head is new
    assert torch.equal(model.decoder.layers[1].attn.k_proj.weight, unpermute(values["blk.1.attn_k.weight"], 2))
    assert torch.equal(model.tok_embed.weight, values["token_embd.weight"])
