"""GGUF out (tformer.interop.gguf_write, `tformer export --format gguf`): tiny llama and gpt2 models with tformer's
tokenizers are written, read back with gguf-py's GGUFReader (names, shapes, types, metadata) and loaded with
transformers' GGUF loader (the reference llama.cpp's own converter is checked against), whose logits must equal
tformer's: to 1e-5 in f32, and for f16 / q8_0 / q4_1 to 1e-5 against tformer's model with the same weights rounded
through the same blocks (quantize -> dequantize), and within what the block sizes predict against the float
model. A llama file comes back through tformer's own load_gguf unchanged; the real SmolLM2 re-exported as q8_0
keeps its predictions and its tokenizer metadata byte for byte (slow). Refusals are one line each, and a crash
mid-write leaves nothing behind.

llama.cpp itself is not run here (it is not built on this machine); transformers' loader undoes the same
conventions (Q/K pair order, the fused gpt2 QKV, a tied head as a missing output.weight).
"""

from __future__ import annotations

import copy
import math
from pathlib import Path

import numpy as np
import pytest
import torch

from tformer.cli import main
from tformer.core.config import ModelConfig
from tformer.core.errors import TformerError
from tformer.data.tokenizers import ByteBPETokenizer, CharTokenizer, GPT2Tokenizer
from tformer.interop.gguf_file import open_gguf
from tformer.interop.gguf_model import load_gguf
from tformer.interop.gguf_quants import dequantize, quantize
from tformer.interop.gguf_tokenizer import tokenizer_from_gguf
from tformer.interop.gguf_vocab import gguf_tokenizer_metadata, keep_gguf_metadata, merges_from_ranks
from tformer.interop.gguf_write import save_gguf
from tformer.model import build

gguf = pytest.importorskip("gguf")
transformers = pytest.importorskip("transformers")

TEXT = "ROMEO: But soft, what light through yonder window breaks?\nIt is the east, and Juliet is the sun.\n"
PROMPT = "But soft, what light through the window? It is the sun."
LLAMA = {"position": "rope", "norm": "rmsnorm", "activation": "silu", "gated_mlp": True, "bias": False}
GPT2 = {"position": "learned", "norm": "layernorm", "activation": "gelu_tanh", "bias": True}
TYPE_NAMES = {"f16": "F16", "q8_0": "Q8_0", "q4_1": "Q4_1"}
# Relative RMS rounding error of one weight, from the block rule, for Gaussian weights (sigma): a block of 32
# has an expected largest |x| of about 2.1 sigma and an expected range of about 4.1 sigma (order statistics); a
# rounding error uniform over one step has RMS step / sqrt(12). Q8_0: step amax / 127; Q4_1: step range / 15;
# F16: 10 mantissa bits, a relative step of 2^-10 at worst and about 2^-10.5 on average.
WEIGHT_ERROR = {"F16": 2 ** -10.5 / math.sqrt(12) * 2, "Q8_0": 2.1 / 127 / math.sqrt(12),
                "Q4_1": 4.1 / 15 / math.sqrt(12)}


def tiny(tokenizer_size: int, seed: int = 0, **kw) -> torch.nn.Module:
    """A small model whose weights sit well away from the initialisation (so that every tensor matters)."""
    fields = {"arch": "decoder", "n_layers": 2, "d_model": 64, "n_heads": 4, "d_ff": 128,
              "vocab_size": tokenizer_size, "max_positions": 64, "tied_embeddings": False}
    fields.update(kw)
    torch.manual_seed(seed)
    model = build(ModelConfig(**fields)).eval()
    with torch.no_grad():
        for p in model.parameters():
            p.add_(torch.randn_like(p) * 0.05)
    return model


def hf_load(path: Path, model=None):
    """transformers' GGUF loader. Its gpt2 table maps context_length to n_ctx (GPT-2 sizes its position table by
    n_positions) and drops feed_forward_length, so for gpt2 those two are handed to it; the file's own values are
    checked through GGUFReader."""
    extra = {}
    if model is not None and model.config.position == "learned":
        extra = {"n_positions": model.config.max_positions, "n_inner": model.config.d_ff}
    return transformers.AutoModelForCausalLM.from_pretrained(str(path.parent), gguf_file=path.name, **extra).eval()


def logits(model, ids) -> torch.Tensor:
    with torch.no_grad():
        return model(torch.tensor([ids])).logits[0]


def rounded(model, ggml_type: str):
    """tformer's model with every matrix the file stores as ``ggml_type`` rounded through its blocks (the position
    table stays F32). Blocks run along rows, so the Q/K row order and the fused QKV do not change the rounding."""
    copy_ = copy.deepcopy(model)
    with torch.no_grad():
        for name, p in copy_.named_parameters():
            if p.dim() == 2 and "positions" not in name:
                p.copy_(dequantize(quantize(p, ggml_type), ggml_type, p.shape))
    return copy_


def relative(a: torch.Tensor, b: torch.Tensor) -> float:
    return ((a - b).pow(2).mean().sqrt() / b.pow(2).mean().sqrt()).item()


def reader_view(path: Path):
    """(tensor name -> (shape in PyTorch order, ggml type name), metadata key -> value) through gguf-py."""
    reader = gguf.GGUFReader(str(path))
    tensors = {t.name: (tuple(int(n) for n in reversed(t.shape.tolist())), t.tensor_type.name)
               for t in reader.tensors}
    meta = {}
    for key, f in reader.fields.items():
        if key.startswith("GGUF."):
            continue
        meta[key] = f.contents()
    return tensors, meta


@pytest.fixture(scope="module")
def bpe():
    return ByteBPETokenizer.train([TEXT * 20, "the quick brown fox jumps over the lazy dog " * 20], vocab_size=300)


@pytest.fixture(scope="module")
def chars():
    return CharTokenizer.from_text(TEXT + PROMPT, specials={"pad": "<pad>", "bos": "<s>", "eos": "</s>"})


@pytest.fixture(scope="module")
def gpt2_tokenizer():
    return GPT2Tokenizer.fetch()


# --- llama -------------------------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def llama(bpe, tmp_path_factory):
    model = tiny(bpe.vocab_size, n_kv_heads=2, **LLAMA)
    folder = tmp_path_factory.mktemp("llama")
    files = {t: save_gguf(model, folder / f"tiny.{t}.gguf", t, bpe) for t in ("f32", "f16", "q8_0", "q4_1")}
    return model, files


def test_llama_file_reads_back_with_gguf_py(llama, bpe):
    model, files = llama
    c = model.config
    result = files["f32"]
    tensors, meta = reader_view(result.path)
    assert result.arch == "llama" and result.tensor_types == {"F32": len(tensors)} and result.tensors == len(tensors)
    want = {"token_embd.weight": (c.vocab_size, 64), "output_norm.weight": (64,), "output.weight": (c.vocab_size, 64)}
    for i in range(2):
        want.update({f"blk.{i}.attn_norm.weight": (64,), f"blk.{i}.attn_q.weight": (64, 64),
                     f"blk.{i}.attn_k.weight": (32, 64), f"blk.{i}.attn_v.weight": (32, 64),
                     f"blk.{i}.attn_output.weight": (64, 64), f"blk.{i}.ffn_norm.weight": (64,),
                     f"blk.{i}.ffn_gate.weight": (128, 64), f"blk.{i}.ffn_up.weight": (128, 64),
                     f"blk.{i}.ffn_down.weight": (64, 128)})
    assert {k: v[0] for k, v in tensors.items()} == want
    assert meta["general.architecture"] == "llama" and meta["general.file_type"] == 0
    assert (meta["llama.block_count"], meta["llama.embedding_length"], meta["llama.feed_forward_length"],
            meta["llama.attention.head_count"], meta["llama.attention.head_count_kv"], meta["llama.context_length"],
            meta["llama.rope.dimension_count"], meta["llama.vocab_size"]) == (2, 64, 128, 4, 2, 64, 16, c.vocab_size)
    assert meta["llama.attention.layer_norm_rms_epsilon"] == pytest.approx(c.norm_eps)
    assert meta["llama.rope.freq_base"] == c.rope_theta
    assert meta["tokenizer.ggml.model"] == "gpt2" and meta["tokenizer.ggml.pre"] == "gpt-2"
    assert len(meta["tokenizer.ggml.tokens"]) == c.vocab_size and meta["tokenizer.ggml.eos_token_id"] == 2
    assert meta["tokenizer.ggml.token_type"][:5] == [3, 3, 3, 3, 1]  # <pad> <s> </s> <mask> are control tokens
    for kind, name in TYPE_NAMES.items():
        types = {v[1] for k, v in reader_view(files[kind].path)[0].items() if k.endswith("norm.weight")}
        assert types == {"F32"}, kind  # norms stay F32 whatever --type says
        assert reader_view(files[kind].path)[0]["blk.0.ffn_up.weight"][1] == name
        assert reader_view(files[kind].path)[1]["general.file_type"] == {"f16": 1, "q8_0": 7, "q4_1": 3}[kind]


def test_llama_f32_logits_equal_transformers(llama, bpe):
    model, files = llama
    ids = bpe.encode(PROMPT)
    assert (logits(hf_load(files["f32"].path), ids) - logits(model, ids)).abs().max().item() < 1e-5


def test_the_files_tokenizer_is_the_models(llama, bpe):
    with open_gguf(llama[1]["f32"].path) as f:
        ours = tokenizer_from_gguf(f.metadata)
    for text in (TEXT, PROMPT, "  spaced   out, 123 numbers'll\tdo\n\n", "naïve café 漢字 😀"):
        assert ours.encode(text) == bpe.encode(text)


@pytest.mark.parametrize("kind", ["f16", "q8_0", "q4_1"])
def test_llama_rounded_logits(llama, bpe, kind):
    model, files = llama
    ids = bpe.encode(PROMPT)
    got = logits(hf_load(files[kind].path), ids)
    ggml = TYPE_NAMES[kind]
    assert (got - logits(rounded(model, ggml), ids)).abs().max().item() < 1e-5
    # Against the float model: each matrix's rounding is a perturbation of relative size WEIGHT_ERROR; the M
    # matrices' independent errors add in quadrature along the residual stream (sqrt(M)); a factor 2 for what
    # the norms and the softmax add at this scale (measured: 0.5-0.9 of the bound over seeds and both archs).
    matrices = [p for n, p in model.named_parameters() if p.dim() == 2]
    for p in matrices:
        err = relative(dequantize(quantize(p, ggml), ggml, p.shape), p)
        assert err < 1.5 * WEIGHT_ERROR[ggml]
    assert relative(got, logits(model, ids)) < 2 * math.sqrt(len(matrices)) * WEIGHT_ERROR[ggml]


def test_llama_round_trip_through_load_gguf(llama, bpe, tmp_path):
    model, files = llama
    back, tok = load_gguf(files["f32"].path, tokenizer=True)
    ids = bpe.encode(PROMPT)
    assert torch.equal(logits(back, ids), logits(model, ids))
    assert back.config.n_kv_heads == 2 and not back.config.tied_embeddings
    assert tok.encode(PROMPT) == ids
    # written again with the file's tokenizer metadata that load_gguf carries, then from the GGUFTokenizer alone
    # (no metadata carried): the same vocabulary either way
    again = save_gguf(back, tmp_path / "again.gguf", "f32", tok)
    assert "as read" in again.tokenizer
    tok.metadata = None
    rebuilt = save_gguf(back, tmp_path / "rebuilt.gguf", "f32", tok)
    assert "rebuilt" in rebuilt.tokenizer
    a = gguf_tokenizer_metadata(files["f32"].path)
    for written in (again, rebuilt):
        b = gguf_tokenizer_metadata(written.path)
        assert a.keys() == b.keys()
        assert all(np.array_equal(np.asarray(a[k][0]), np.asarray(b[k][0])) and a[k][1] == b[k][1] for k in a)
    assert torch.equal(logits(load_gguf(again.path), ids), logits(model, ids))


def test_tied_head_written_once_and_grouped_heads(bpe, tmp_path):
    model = tiny(bpe.vocab_size, n_kv_heads=1, tied_embeddings=True, head_dim=32, **LLAMA)
    result = save_gguf(model, tmp_path / "tied.gguf", "f32", bpe)
    tensors, meta = reader_view(result.path)
    assert "output.weight" not in tensors and tensors["blk.0.attn_q.weight"][0] == (128, 64)
    assert meta["llama.attention.key_length"] == 32 and meta["llama.rope.dimension_count"] == 32
    ids = bpe.encode(PROMPT)
    assert (logits(hf_load(result.path), ids) - logits(model, ids)).abs().max().item() < 1e-5
    back = load_gguf(result.path)
    assert back.config.tied_embeddings and torch.equal(logits(back, ids), logits(model, ids))


def test_rows_that_are_not_whole_blocks_fall_back_to_f16(chars, tmp_path):
    model = tiny(chars.vocab_size, d_model=48, n_heads=4, d_ff=64, **LLAMA)  # rows of 48: not whole blocks of 32
    result = save_gguf(model, tmp_path / "odd.gguf", "q8_0", chars)
    tensors, _ = reader_view(result.path)
    assert tensors["blk.0.ffn_down.weight"][1] == "Q8_0"  # rows of 64
    assert tensors["blk.0.ffn_up.weight"][1] == "F16" and tensors["token_embd.weight"][1] == "F16"
    assert len(result.notes) == 1 and "written as F16 instead" in result.notes[0]
    assert result.tensor_types == {"F16": 14, "F32": 5, "Q8_0": 2}  # embedding, head, 6 of 7 per layer
    ids = chars.encode(PROMPT)
    got = logits(hf_load(result.path), ids)
    ref = copy.deepcopy(model)
    with torch.no_grad():
        for _, p in ref.named_parameters():
            if p.dim() == 2:
                kind = "Q8_0" if p.shape[1] % 32 == 0 else "F16"
                p.copy_(dequantize(quantize(p, kind), kind, p.shape))
    assert (got - logits(ref, ids)).abs().max().item() < 1e-5


# --- gpt2 --------------------------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def gpt2(bpe, tmp_path_factory):
    model = tiny(bpe.vocab_size, d_model=32, d_ff=128, n_heads=2, **GPT2)
    folder = tmp_path_factory.mktemp("gpt2")
    files = {t: save_gguf(model, folder / f"gpt2.{t}.gguf", t, bpe) for t in ("f32", "q8_0", "q4_1")}
    return model, files


def test_gpt2_file_and_logits(gpt2, bpe):
    model, files = gpt2
    v = model.config.vocab_size
    tensors, meta = reader_view(files["f32"].path)
    want = {"token_embd.weight": (v, 32), "position_embd.weight": (64, 32), "output.weight": (v, 32),
            "output_norm.weight": (32,), "output_norm.bias": (32,)}
    for i in range(2):
        b = f"blk.{i}"
        want.update({f"{b}.attn_norm.weight": (32,), f"{b}.attn_norm.bias": (32,), f"{b}.attn_qkv.weight": (96, 32),
                     f"{b}.attn_qkv.bias": (96,), f"{b}.attn_output.weight": (32, 32), f"{b}.attn_output.bias": (32,),
                     f"{b}.ffn_norm.weight": (32,), f"{b}.ffn_norm.bias": (32,), f"{b}.ffn_up.weight": (128, 32),
                     f"{b}.ffn_up.bias": (128,), f"{b}.ffn_down.weight": (32, 128), f"{b}.ffn_down.bias": (32,)})
    assert {k: v[0] for k, v in tensors.items()} == want
    assert (meta["general.architecture"], meta["gpt2.block_count"], meta["gpt2.context_length"],
            meta["gpt2.embedding_length"], meta["gpt2.feed_forward_length"], meta["gpt2.attention.head_count"]) \
        == ("gpt2", 2, 64, 32, 128, 2)
    assert meta["gpt2.attention.layer_norm_epsilon"] == pytest.approx(1e-5)
    q8 = reader_view(files["q8_0"].path)[0]
    assert q8["position_embd.weight"][1] == "F32" and q8["blk.0.attn_qkv.weight"][1] == "Q8_0"
    assert q8["blk.0.attn_qkv.bias"][1] == "F32" and q8["blk.0.ffn_norm.bias"][1] == "F32"
    ids = bpe.encode(PROMPT)
    assert (logits(hf_load(files["f32"].path, model), ids) - logits(model, ids)).abs().max().item() < 1e-5
    for kind in ("q8_0", "q4_1"):
        got, ggml = logits(hf_load(files[kind].path, model), ids), TYPE_NAMES[kind]
        assert (got - logits(rounded(model, ggml), ids)).abs().max().item() < 1e-5, kind
        n = sum(1 for name, p in model.named_parameters() if p.dim() == 2 and "positions" not in name)
        assert relative(got, logits(model, ids)) < 2 * math.sqrt(n) * WEIGHT_ERROR[ggml], kind


def test_gpt2_without_linear_biases_gets_zero_ones(bpe, tmp_path):
    model = tiny(bpe.vocab_size, d_model=32, d_ff=128, n_heads=2, **{**GPT2, "bias": False})
    result = save_gguf(model, tmp_path / "nobias.gguf", "f32", bpe)
    with open_gguf(result.path) as f:
        assert not np.asarray(f.raw("blk.0.attn_qkv.bias")).any()
    ids = bpe.encode(PROMPT)
    assert (logits(hf_load(result.path, model), ids) - logits(model, ids)).abs().max().item() < 1e-5


def test_gpt2_vocabulary_from_tiktoken_ranks(gpt2_tokenizer, tmp_path):
    # the embedding a little larger than the vocabulary, as GPT-2 checkpoints often pad it to a multiple of 64
    model = tiny(50304, n_layers=1, d_model=32, d_ff=128, n_heads=2, **GPT2)
    result = save_gguf(model, tmp_path / "gpt2.gguf", "q8_0", gpt2_tokenizer)
    assert any("unused tokens" in n for n in result.notes)
    with open_gguf(result.path) as f:
        meta = f.metadata
        ours = tokenizer_from_gguf(meta)
    merges, tokens = meta["tokenizer.ggml.merges"], meta["tokenizer.ggml.tokens"]
    types = meta["tokenizer.ggml.token_type"]
    assert len(merges) == 50000 and merges[:5] == ["Ġ t", "Ġ a", "h e", "i n", "r e"]  # GPT-2's merges.txt
    assert meta["tokenizer.ggml.bos_token_id"] == meta["tokenizer.ggml.eos_token_id"] == 50256
    assert (tokens[50256], types[50256], tokens[50257], types[50257]) == ("<|endoftext|>", 3, "[PAD50257]", 5)
    hf = transformers.AutoTokenizer.from_pretrained(str(result.path.parent), gguf_file=result.path.name)
    for text in (TEXT, PROMPT, "  It's 2024: naïve café, 3.50€ — 漢字 😀\n\n\tdone"):
        want = gpt2_tokenizer.encode(text)
        assert ours.encode(text) == want and hf(text)["input_ids"] == want


def test_merges_from_ranks_is_byte_pair_order():
    ranks = {bytes([b]): b for b in range(256)}
    for token in (b"ab", b"abc", b"bc", b"abcbc"):  # abc from ab + c: "bc" ranks after "abc"
        ranks[token] = len(ranks)
    assert merges_from_ranks(ranks) == [(b"a", b"b"), (b"ab", b"c"), (b"b", b"c"), (b"abc", b"bc")]


# --- characters, and a GGUF source -------------------------------------------------------------------------------


def test_char_tokenizer_becomes_single_byte_tokens(chars, tmp_path):
    model = tiny(chars.vocab_size, **GPT2)
    result = save_gguf(model, tmp_path / "chars.gguf", "f32", chars)
    _, meta = reader_view(result.path)
    assert "tokenizer.ggml.merges" in meta and meta["tokenizer.ggml.merges"] == []  # the key llama.cpp requires
    assert meta["tokenizer.ggml.tokens"][:4] == ["<pad>", "<s>", "</s>", "\u010a"]  # "\n" in the byte alphabet
    with open_gguf(result.path) as f:
        ours = tokenizer_from_gguf(f.metadata)
    for text in (TEXT, PROMPT):
        assert ours.encode(text) == chars.encode(text)
    ids = chars.encode(PROMPT)
    assert (logits(hf_load(result.path, model), ids) - logits(model, ids)).abs().max().item() < 1e-5
    plain = CharTokenizer.from_text(TEXT)  # no end-of-text token: llama.cpp falls back to id 11
    note = save_gguf(tiny(plain.vocab_size, **GPT2), tmp_path / "plain.gguf", "f32", plain).notes
    assert any("no end-of-text token" in n and "token 11" in n for n in note)


def test_exact_gelu_is_written_with_a_note(chars, tmp_path):
    model = tiny(chars.vocab_size, **{**GPT2, "activation": "gelu"})
    result = save_gguf(model, tmp_path / "gelu.gguf", "f32", chars)
    assert any("tanh approximation" in n for n in result.notes)
    ids = chars.encode(PROMPT)
    # transformers' gpt2 (gelu_new), as llama.cpp: the difference is the two GELUs' (under 5e-4 per activation)
    diff = (logits(hf_load(result.path, model), ids) - logits(model, ids)).abs().max().item()
    assert 0 < diff < 1e-2


def test_cli_exports_and_reexports_a_gguf_keeping_its_tokenizer(chars, tmp_path, capsys):
    source = save_gguf(tiny(chars.vocab_size, tied_embeddings=True, **LLAMA), tmp_path / "src.gguf", "f16",
                       chars).path
    out = tmp_path / "out" / "again.q4_1.gguf"
    assert main(["export", "--format", "gguf", "--type", "q4_1", "--gguf", str(source), "--out", str(out)]) == 0
    printed = capsys.readouterr().out
    assert str(out) in printed and "type q4_1" in printed and "F32 5, Q4_1 15" in printed
    assert f"{out.stat().st_size:,} bytes" in printed and "as read" in printed
    a, b = gguf_tokenizer_metadata(source), gguf_tokenizer_metadata(out)
    assert list(a) == list(b) and all(a[k][1] == b[k][1] for k in a)
    assert all(np.array_equal(np.asarray(a[k][0]), np.asarray(b[k][0])) for k in a)
    assert sorted(p.name for p in out.parent.iterdir()) == [out.name]  # no temporary left beside it


def test_cli_exports_a_training_run(tmp_path, capsys):
    from tiny_checkpoint import write_checkpoint

    run = write_checkpoint(tmp_path / "run", "decoder", True, TEXT, 64, activation="gelu_tanh")
    out = tmp_path / "run.q8_0.gguf"
    assert main(["export", "--format", "gguf", "--type", "q8_0", "--ckpt", str(run), "--out", str(out)]) == 0
    printed = capsys.readouterr().out
    assert "as a GGUF gpt2 model" in printed and "characters as single-byte tokens" in printed
    assert reader_view(out)[1]["general.file_type"] == 7


# --- refusals and faults -----------------------------------------------------------------------------------------


def one_line(exc) -> str:
    text = str(exc.value)
    assert "\n" not in text
    return text


@pytest.mark.parametrize("fields, words", [
    ({"arch": "encoder"}, "encoder-only"),
    ({"arch": "rnn"}, "recurrent"),
    (dict(**LLAMA, attn_impl="sliding", attn_window=16), "sliding-window"),
    (dict(**{**LLAMA, "bias": True}), "biases"),
    (dict(**{**LLAMA, "position": "learned"}), "position='learned' with norm='rmsnorm'"),
    (dict(**GPT2, attn_impl="performer"), "attention kind 'performer'"),
    (dict(**{**GPT2, "activation": "relu"}), "activation='relu'"),
    (dict(**{**LLAMA, "rope_scaling": "ntk", "rope_factor": 2.0}), "RoPE scaling"),
    (dict(**{**GPT2, "norm_placement": "post"}), "norm_placement"),
    (dict(**{**LLAMA, "quantize": "q4_1"}), "hold q4_1 weights; export the float model (a GGUF file read with "
                                            "--gguf-weights dequantize"),
])
def test_what_no_gguf_holds_is_refused_in_one_line(chars, tmp_path, fields, words):
    with pytest.raises(TformerError) as exc:
        save_gguf(tiny(chars.vocab_size, **fields), tmp_path / "x.gguf", "f32", chars)
    text = one_line(exc)
    assert words in text and "tformer writes GGUF for llama" in text and "gpt2" in text
    assert not (tmp_path / "x.gguf").exists()


def test_tokenizer_refusals(chars, tmp_path):
    model = tiny(chars.vocab_size, **GPT2)
    with pytest.raises(TformerError) as exc:
        save_gguf(model, tmp_path / "x.gguf", "f32", None)
    assert "without its tokenizer" in one_line(exc)
    wide = CharTokenizer.from_text("abc é")
    with pytest.raises(TformerError) as exc:
        save_gguf(tiny(wide.vocab_size, **GPT2), tmp_path / "x.gguf", "f32", wide)
    assert "'é' (U+00E9)" in one_line(exc)
    with pytest.raises(TformerError) as exc:
        save_gguf(model, tmp_path / "x.gguf", "q5_0", chars)
    assert "--type q5_0" in one_line(exc)
    assert not any(tmp_path.iterdir())


def test_cli_refusals(tmp_path, capsys):
    from tiny_checkpoint import write_checkpoint

    run = write_checkpoint(tmp_path / "run", "decoder", True, TEXT, 64)
    cases = [
        (["--type", "q5_0", "--ckpt", str(run), "--out", str(tmp_path / "a.gguf")], "--type q5_0"),
        (["--ckpt", str(run), "--out", str(run / "inside.gguf")], "inside the --ckpt folder"),
        (["--preset", "bert-base", "--out", str(tmp_path / "b.gguf")], "encoder-only"),
        (["--preset", "gpt2", "--out", str(tmp_path / "c.gguf")], "needs the model's tokenizer"),
        (["--ckpt", str(run), "--out", str(tmp_path / "folder")], "is a folder"),
    ]
    (tmp_path / "folder").mkdir()
    for argv, words in cases:
        assert main(["export", "--format", "gguf", *argv]) == 2
        err = capsys.readouterr().err.strip()
        assert words in err and "\n" not in err, argv
    assert main(["export", "--type", "f16", "--ckpt", str(run), "--out", str(tmp_path / "hf")]) == 2
    assert "--type picks a GGUF file's tensor type" in capsys.readouterr().err
    assert sorted(p.name for p in tmp_path.iterdir()) == ["folder", "run"]


def test_a_crash_mid_write_leaves_nothing(chars, tmp_path, monkeypatch):
    model = tiny(chars.vocab_size, **GPT2)
    out = tmp_path / "crash.gguf"
    calls = []

    def failing(self, tensor, *args, **kwargs):
        calls.append(1)
        if len(calls) == 5:
            raise RuntimeError("killed halfway")
        return real(self, tensor, *args, **kwargs)

    real = gguf.GGUFWriter.write_tensor_data
    monkeypatch.setattr(gguf.GGUFWriter, "write_tensor_data", failing)
    with pytest.raises(RuntimeError, match="killed halfway"):
        save_gguf(model, out, "q8_0", chars)
    assert not any(tmp_path.iterdir())  # neither the file nor its temporary
    out.write_bytes(b"the previous file")
    calls.clear()
    with pytest.raises(RuntimeError, match="killed halfway"):
        save_gguf(model, out, "q8_0", chars)
    assert out.read_bytes() == b"the previous file" and [p.name for p in tmp_path.iterdir()] == [out.name]


# --- the real SmolLM2 --------------------------------------------------------------------------------------------


@pytest.mark.slow  # about a minute on 2 cores: the 135M model is loaded, written and read back by transformers
def test_smollm2_reexported_as_q8_0(tmp_path):
    from tformer.interop.gguf_config import resolve_gguf

    source = resolve_gguf("smollm2-135m-instruct")
    model, tok = load_gguf("smollm2-135m-instruct", tokenizer=True, weights="dequantize")
    want = gguf_tokenizer_metadata(source)
    # Without its file's metadata the tokenizer is rebuilt: the same vocabulary, types, merges, ids and template
    rebuilt = gguf_tokenizer_metadata(save_gguf(model, tmp_path / "rebuilt.gguf", "q8_0", tok).path)
    for key in ("tokens", "token_type", "merges", "bos_token_id", "eos_token_id", "padding_token_id",
                "unknown_token_id", "pre", "add_bos_token"):
        key = f"tokenizer.ggml.{key}"
        assert np.array_equal(np.asarray(rebuilt[key][0]), np.asarray(want[key][0])), key
    assert rebuilt["tokenizer.chat_template"] == want["tokenizer.chat_template"]
    keep_gguf_metadata(tok, source)
    result = save_gguf(model, tmp_path / "smollm2.q8_0.gguf", "q8_0", tok)
    assert result.tensor_types == {"F32": 61, "Q8_0": 211} and result.tensors == 272
    got = gguf_tokenizer_metadata(result.path)
    assert list(got) == list(want)
    for key, (value, kind) in want.items():
        assert got[key][1] == kind and np.array_equal(np.asarray(got[key][0]), np.asarray(value)), key
    # The written file read by transformers and by tformer: the same Q8_0 tensors, dequantized alike, so the same
    # logits (the two models' sums in another order: 1e-4) and the same pick everywhere; against the fp32 model it
    # was written from, the Q8_0 rounding keeps each prompt's next token.
    ref, back = hf_load(result.path), load_gguf(result.path, weights="dequantize")
    for prompt in ("The capital of France is", "Once upon a time, in a small village,",
                   "Water boils at a temperature of"):
        ids = tok.encode(prompt)
        ours, theirs = logits(back, ids), logits(ref, ids)
        assert (ours - theirs).abs().max().item() < 1e-4, prompt
        assert torch.equal(ours.argmax(-1), theirs.argmax(-1)), prompt
        assert logits(model, ids)[-1].argmax() == ours[-1].argmax(), prompt
