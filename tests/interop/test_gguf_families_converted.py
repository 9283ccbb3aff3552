"""Each GGUF family a CPU user downloads, read and written against references nobody here wrote: small files made
by llama.cpp's own converter from tiny random transformers models (scripts/gguf_families/make_files.py, kept in the
repository), read by transformers' GGUF loader beside tformer's.

Per family: logits within 1e-5 of transformers' on the same file, greedy tokens equal, tokenizer ids equal to
transformers' GGUF tokenizer on text with whitespace runs, digits, emoji and code, the chat template rendered as
transformers renders it, the ledger's parameters equal to the file's tensors, and the file tformer writes back (f32,
and Q8_0 kept in its blocks) read by transformers with equal logits."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
import torch

from tformer.cost.ledger import ledger
from tformer.generate import generate
from tformer.generate.chat import chat_ids, template_for
from tformer.interop.gguf_config import config_from_gguf
from tformer.interop.gguf_file import open_gguf
from tformer.interop.gguf_model import load_gguf
from tformer.interop.gguf_write import save_gguf
from tformer.model import ggml_kernel

transformers = pytest.importorskip("transformers")
transformers.logging.set_verbosity_error()
transformers.logging.disable_progress_bar()

FILES = Path(__file__).resolve().parents[2] / "scripts" / "gguf_families"
FAMILIES = ("llama", "llama3", "mistral", "qwen2", "qwen3", "phi3", "gpt2")
# the file's architecture where it is not the family's name: Llama 3's scaling is llama's with rope_freqs, and
# llama.cpp's converter files Mistral as llama
ARCHITECTURE = {"llama3": "llama", "mistral": "llama"}
WRITTEN_AS = {"phi3": "llama", "llama3": "llama", "mistral": "llama"}  # a phi3 file's model is a llama model
# What the llama3 and mistral files were made from (scripts/gguf_families/make_files.py): transformers' GGUF loader
# reads neither rope_freqs nor rope.scaling.*, so its model is told; tformer reads them from the file.
LLAMA3_ROPE = {"rope_type": "llama3", "rope_theta": 500000.0, "factor": 8.0, "low_freq_factor": 1.0,
               "high_freq_factor": 4.0, "original_max_position_embeddings": 256}
LINEAR_ROPE = {"rope_type": "linear", "rope_theta": 10000.0, "factor": 2.0}
HF_OVERRIDES = {"llama3": {"rope_parameters": LLAMA3_ROPE}, "mistral": {"rope_parameters": LINEAR_ROPE}}
TEXT = ("Hello  world!\n\n\tdef f(x):\n        return 12345 + 0x2A  # ÄÖÜ café 🦙🚀✅ 我想在apple工作 "
        "I've 'RE 3.14 ...!!!   ")
CHAT = [{"role": "system", "content": "You are terse."}, {"role": "user", "content": "What is 2 + 2?"},
        {"role": "assistant", "content": "4."}, {"role": "user", "content": "And 3 + 3?"}]


def _hf(folder: Path, name: str, family: str):
    model = transformers.AutoModelForCausalLM.from_pretrained(str(folder), gguf_file=name, dtype=torch.float32,
                                                              **HF_OVERRIDES.get(family, {}))
    return model.eval()


@pytest.fixture(scope="module", params=FAMILIES)
def family(request):
    name = request.param
    ours, tok = load_gguf(FILES / f"{name}.gguf", tokenizer=True)
    return name, ours.eval(), tok, _hf(FILES, f"{name}.gguf", name)


def _ids(vocab: int, rows: int = 2, t: int = 40):  # past the window of 16 the phi3 file names (and nobody applies)
    return torch.randint(0, vocab, (rows, t), generator=torch.Generator().manual_seed(0))


def test_the_file_is_the_family_it_says(family):
    name, ours, _, _ = family
    with open_gguf(FILES / f"{name}.gguf") as f:
        assert f.metadata["general.architecture"] == ARCHITECTURE.get(name, name)
        assert f.metadata["general.file_type"] == 0  # all f32: the converter's --outtype f32
    c = ours.config
    expected = {"llama": ("rope", "rmsnorm", False, False, False), "llama3": ("rope", "rmsnorm", False, False, True),
                "mistral": ("rope", "rmsnorm", False, False, False),
                "qwen2": ("rope", "rmsnorm", True, False, True),
                "qwen3": ("rope", "rmsnorm", False, True, False), "phi3": ("rope", "rmsnorm", False, False, False),
                "gpt2": ("learned", "layernorm", True, False, True)}
    assert (c.position, c.norm, c.qkv_has_bias, c.qk_norm, c.tied_embeddings) == expected[name]
    assert c.attn_impl == "sdpa"  # phi3's attention.sliding_window is read as llama.cpp computes it: not at all
    if name == "llama3":  # the scaling's parameters, found in the file's rope_freqs
        spec = LLAMA3_ROPE
        assert (c.rope_scaling, c.rope_factor, c.rope_low_freq_factor, c.rope_high_freq_factor,
                c.rope_original_positions) == ("llama3", spec["factor"], spec["low_freq_factor"],
                                               spec["high_freq_factor"], spec["original_max_position_embeddings"])
    elif name == "mistral":
        assert (c.rope_scaling, c.rope_factor) == ("linear", LINEAR_ROPE["factor"])
    else:
        assert c.rope_scaling == "none"


def test_logits_equal_transformers_gguf_loader(family):
    _, ours, _, hf = family
    ids = _ids(ours.config.vocab_size)
    with torch.no_grad():
        assert (ours(ids).logits - hf(ids).logits).abs().max().item() < 1e-5


def test_greedy_tokens_equal(family):
    _, ours, _, hf = family
    prompt = _ids(ours.config.vocab_size, rows=1, t=5)
    want = hf.generate(prompt, max_new_tokens=12, do_sample=False, eos_token_id=None, pad_token_id=0)[0, 5:]
    assert generate(ours, prompt, max_new_tokens=12, stop_tokens=[]).sequences[0] == want.tolist()


def test_tokenizer_ids_equal_transformers_gguf_tokenizer(family):
    name, _, tok, _ = family
    hf_tok = transformers.AutoTokenizer.from_pretrained(str(FILES), gguf_file=f"{name}.gguf")
    ids = tok.encode(TEXT)  # the text's own ids: BOS is the prompt's business (chat_ids, generate's prompt_ids)
    assert ids == hf_tok.encode(TEXT, add_special_tokens=False) and len(ids) > 20
    assert tok.decode(ids) == TEXT


@pytest.mark.parametrize("name", ["llama", "llama3", "mistral", "qwen2", "qwen3", "phi3"])
def test_the_chat_template_renders_as_transformers_renders_it(name):
    _, tok = load_gguf(FILES / f"{name}.gguf", tokenizer=True)
    hf_tok = transformers.AutoTokenizer.from_pretrained(str(FILES), gguf_file=f"{name}.gguf")
    with open_gguf(FILES / f"{name}.gguf") as f:
        source = f.metadata["tokenizer.chat_template"]
    want = hf_tok.apply_chat_template(CHAT, chat_template=source, tokenize=False, add_generation_prompt=True)
    template = template_for(tok)
    got = template.render(CHAT, add_generation_prompt=True)
    # Llama 3's template writes today's date: both renderings read the clock, so one made just past midnight differs
    today = re.compile(r"Today Date: [^\n]*")
    assert today.sub("", got) == today.sub("", want) and ("Today Date" in got) == (name.startswith("llama"))
    theirs = hf_tok.encode(got, add_special_tokens=False)
    if getattr(tok, "add_bos", False) and theirs[:1] != [tok.bos_id]:  # tformer's prompt adds the file's BOS
        theirs = [tok.bos_id, *theirs]
    assert chat_ids(template, tok, CHAT) == theirs


def test_the_ledger_counts_the_file_s_tensors(family):
    name, ours, _, _ = family
    with open_gguf(FILES / f"{name}.gguf") as f:
        # every tensor but rope_freqs, Llama 3's RoPE divisors (a constant of the config, not a weight)
        in_file = sum(int(torch.tensor(info.shape).prod()) for n, info in f.tensors.items() if n != "rope_freqs.weight")
    config = config_from_gguf(FILES / f"{name}.gguf")
    assert ledger(config).params["total"] == in_file == sum(p.numel() for p in ours.parameters())


@pytest.mark.parametrize("ggml_type", ["f32", "q8_0"])
def test_the_file_tformer_writes_reads_back_in_transformers(family, ggml_type, tmp_path):
    name, ours, tok, hf = family
    out = tmp_path / f"{name}-{ggml_type}.gguf"
    # general.name "tiny-<family>", as the converter's: transformers' loader reads a llama file whose name is exactly
    # "mistral" as its own mistral type, which its GGUF tables then lack (and llama.cpp gives a model named "phi3"
    # Phi-3's SentencePiece tokens by name)
    ours.config = ours.config.replace(name=f"tiny-{name}".replace("phi3", "phi"))
    save_gguf(ours, out, ggml_type, tokenizer=tok)
    with open_gguf(out) as f:
        assert f.metadata["general.architecture"] == WRITTEN_AS.get(name, name)
        assert f.metadata["tokenizer.ggml.pre"] == tok.pre
    back = _hf(tmp_path, out.name, name)
    if name == "llama3":  # tformer writes the divisors back: the file's own, to fp32 rounding
        with open_gguf(out) as f, open_gguf(FILES / f"{name}.gguf") as g:
            assert torch.allclose(torch.from_numpy(f.raw("rope_freqs.weight").copy()).view(torch.float32),
                                  torch.from_numpy(g.raw("rope_freqs.weight").copy()).view(torch.float32), rtol=1e-6)
    ids = _ids(ours.config.vocab_size)
    with torch.no_grad():
        ref = hf(ids).logits
        assert (back(ids).logits - ref).abs().max().item() < (1e-5 if ggml_type == "f32" else 0.1)
        if ggml_type == "q8_0" and name != "gpt2":  # the blocks kept give the widened blocks' numbers
            kept = load_gguf(out, weights="keep").eval()
            assert (kept(ids).logits - back(ids).logits).abs().max().item() < 1e-4
            if ggml_kernel.available():  # and the block kernel, activations rounded to 8 bits, about them
                kernel = load_gguf(out, weights="kernel").eval()
                assert (kernel(ids).logits - kept(ids).logits).abs().max().item() < 0.1


@pytest.mark.parametrize("name", ["phi3", "gpt2"])
def test_a_quantized_file_keeps_what_it_can_and_widens_its_fused_matrices(name):
    """The converter's Q8_0 files: phi3 fuses q/k/v and gate/up, gpt2 q/k/v, each into one tensor; tformer widens
    those and keeps the rest in their blocks. Kept equals widened exactly, widened equals transformers' loader (which
    dequantizes every tensor with gguf-py), and the block kernel runs the kept ones."""
    path = FILES / f"{name}-q8_0.gguf"
    with open_gguf(path) as f:
        assert f.tensors["blk.0.attn_qkv.weight"].ggml_type in ("Q8_0", "F16")
        assert f.tensors["blk.0.ffn_down.weight"].ggml_type == "Q8_0"
    widened = load_gguf(path, weights="dequantize").eval()
    kept = load_gguf(path, weights="keep").eval()
    assert kept.config.quantize == "mixed" and "down:q8_0" in kept.config.quantize_layers[0]
    assert "q:" not in kept.config.quantize_layers[0]  # the fused q/k/v stay float
    hf = _hf(FILES, path.name, name)
    ids = _ids(widened.config.vocab_size)
    with torch.no_grad():
        assert torch.equal(kept(ids).logits, widened(ids).logits)
        assert (widened(ids).logits - hf(ids).logits).abs().max().item() < 1e-5
        if ggml_kernel.available():
            kernel = load_gguf(path, weights="kernel").eval()
            assert (kernel(ids).logits - kept(ids).logits).abs().max().item() < 0.1


def test_served_tokens_equal_generated(family):
    """The serving pool (slot cache, chunked prefill, rows joining and leaving) gives each prompt the tokens generate
    gives it alone, for every family's differences: Qwen2's q/k/v biases, Qwen3's q/k norms and 128-wide heads,
    Llama 3's and Mistral's RoPE scaling, GPT-2's learned positions."""
    from tformer.generate.continuous import ContinuousBatcher, Request

    _, ours, _, _ = family
    gen = torch.Generator().manual_seed(3)
    lengths = (3, 17, 100, 30, 5)  # up to near the files' 128-token context
    prompts = [torch.randint(0, ours.config.vocab_size, (n,), generator=gen).tolist() for n in lengths]
    alone = [generate(ours, [p], max_new_tokens=8, stop_tokens=[]).sequences[0] for p in prompts]
    assert len({tuple(a) for a in alone}) > 1
    batcher = ContinuousBatcher(ours, max_batch=4)  # fewer rows than prompts: one waits for a row to free
    got = [[] for _ in prompts]
    for i, p in enumerate(prompts):
        batcher.submit(Request(p, 8), lambda seq, token, finish, i=i: token is not None and got[i].append(token))
    batcher.start()
    assert batcher.shutdown(drain=True, timeout=120)
    assert got == alone


@pytest.mark.slow
@pytest.mark.parametrize("name", ["llama3", "qwen3"])
def test_compiled_generate_equals_eager(name):
    """The compiled step traces the same forward: Llama 3's scaled RoPE tables and Qwen3's q/k norms included."""
    model = load_gguf(FILES / f"{name}.gguf").eval()
    prompts = torch.randint(0, model.config.vocab_size, (2, 12), generator=torch.Generator().manual_seed(0))
    eager = generate(model, prompts, max_new_tokens=10, stop_tokens=[]).sequences
    assert generate(model, prompts, max_new_tokens=10, stop_tokens=[], compile=True).sequences == eager
