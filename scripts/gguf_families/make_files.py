"""Make the small GGUF files the family tests read (tests/interop/test_gguf_families_converted.py), with llama.cpp's
own converter: run once, the files kept beside this script, so the tests need neither a download nor the converter.

    python scripts/gguf_families/make_files.py [--llama-cpp DIR]   # DIR: the sdist's vendor/llama.cpp

For each family: a tiny random transformers model (2 layers, d_model 64, GQA, biases and norm scales moved off their
initial values so they matter), a byte-level BPE tokenizer trained here on a small fixed text with that family's
pre-tokenizer pattern and special tokens (a 512-token vocabulary: a real one would make each file megabytes), the
family's chat template from llama.cpp's models/templates, saved as a Hugging Face folder; then
``convert_hf_to_gguf.py --outtype f32``. One change to the converter, made in its process only: it names a BPE
pre-tokenizer by hashing the tokens of a test string, which only the real vocabularies reproduce, so
``get_vocab_base_pre`` is answered with the family's name (and its SentencePiece probe is told there is no
tokenizer.model, as there is none, without importing sentencepiece).
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
from pathlib import Path

HERE = Path(__file__).resolve().parent
DEFAULT_LLAMA_CPP = Path.home() / ".cache/llamacpp/llama_cpp_python-0.3.36/vendor/llama.cpp"
VOCAB = 512

# The pre-tokenizer patterns, as the families' tokenizer.json files spell them.
GPT2 = r"'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+"
LLAMA3 = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*"
          r"|\s*[\r\n]+|\s+(?!\S)|\s+")
QWEN2 = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+"
         r"|\s+(?!\S)|\s+")
COMMON = dict(num_hidden_layers=2, hidden_size=64, num_attention_heads=4, num_key_value_heads=2, intermediate_size=96,
              max_position_embeddings=128, rms_norm_eps=1e-6, rope_theta=10000.0)
LLAMA3_ROPE = {"rope_type": "llama3", "rope_theta": 500000.0, "factor": 8.0, "low_freq_factor": 1.0,
               "high_freq_factor": 4.0, "original_max_position_embeddings": 256}
QWEN_SPECIAL = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
FAMILIES = {
    # name: (transformers class, config fields, pre-tokenizer name and pattern, special tokens, bos, eos, template)
    "llama": ("LlamaForCausalLM", dict(COMMON, model_type="llama", tie_word_embeddings=False), "llama-bpe", LLAMA3,
              ["<|begin_of_text|>", "<|end_of_text|>", "<|start_header_id|>", "<|end_header_id|>", "<|eot_id|>"],
              "<|begin_of_text|>", "<|eot_id|>", "meta-llama-Llama-3.2-3B-Instruct.jinja"),
    # Llama 3.1-3.3's RoPE scaling: converted into per-frequency divisors (rope_freqs); head_dim 32 and an original
    # context of 256 put two of the 16 frequencies in the blended band, as Llama 3.2's 64-wide heads put several
    "llama3": ("LlamaForCausalLM", dict(COMMON, model_type="llama", num_attention_heads=2, num_key_value_heads=1,
                                        max_position_embeddings=1024, tie_word_embeddings=True,
                                        rope_parameters=LLAMA3_ROPE), "llama-bpe", LLAMA3,
               ["<|begin_of_text|>", "<|end_of_text|>", "<|start_header_id|>", "<|end_header_id|>", "<|eot_id|>"],
               "<|begin_of_text|>", "<|eot_id|>", "meta-llama-Llama-3.2-3B-Instruct.jinja"),
    # Mistral without its window (llama.cpp files Mistral 7B as llama: no window key) and linear RoPE scaling
    "mistral": ("MistralForCausalLM", dict(COMMON, model_type="mistral", sliding_window=None, tie_word_embeddings=False,
                                           rope_parameters={"rope_type": "linear", "rope_theta": 10000.0,
                                                            "factor": 2.0}), "llama-bpe", LLAMA3,
                ["<s>", "</s>", "[INST]", "[/INST]"], "<s>", "</s>", "Mistral-Small-3.2-24B-Instruct-2506.jinja"),
    "qwen2": ("Qwen2ForCausalLM", dict(COMMON, model_type="qwen2", tie_word_embeddings=True), "qwen2", QWEN2,
              QWEN_SPECIAL, None, "<|im_end|>", "Qwen-Qwen2.5-7B-Instruct.jinja"),
    # head_dim 128 as Qwen3-0.6B's (not d_model / heads): transformers' GGUF loader ignores qwen3.attention.key_length
    # and takes Qwen3Config's default, 128; two query heads over one key/value head keep the file small
    "qwen3": ("Qwen3ForCausalLM", dict(COMMON, model_type="qwen3", head_dim=128, num_attention_heads=2,
                                       num_key_value_heads=1, tie_word_embeddings=False), "qwen2",
              QWEN2, QWEN_SPECIAL, None, "<|im_end|>", "Qwen-Qwen3-0.6B.jinja"),
    # a window of 16 named as Phi-3-mini-4k names 2047, which llama.cpp and transformers' GGUF loader both leave
    # unused; a GPT-2 style tokenizer, as the converter takes for Phi-4-mini (Phi-3's own is SentencePiece:
    # bench/llamacpp_vocab.py checks it)
    "phi3": ("Phi3ForCausalLM", dict(COMMON, model_type="phi3", sliding_window=16, original_max_position_embeddings=128,
                                     tie_word_embeddings=False, pad_token_id=None), "gpt-2", GPT2,
             ["<|endoftext|>", "<|user|>", "<|assistant|>", "<|system|>", "<|end|>"], "<|endoftext|>", "<|end|>",
             "microsoft-Phi-3.5-mini-instruct.jinja"),
    # the MLP 4 x n_embd wide: llama.cpp's converter writes feed_forward_length = 4 * n_embd whatever n_inner says;
    # 1,024 positions as GPT-2's: transformers' GGUF loader does not read gpt2.context_length (it keeps the default)
    "gpt2": ("GPT2LMHeadModel", dict(model_type="gpt2", n_layer=2, n_embd=48, n_head=4, n_positions=1024, n_ctx=1024,
                                     tie_word_embeddings=True), "gpt-2", GPT2, ["<|endoftext|>"], "<|endoftext|>",
             "<|endoftext|>", None),
}
# What the tokenizers learn from: prose, digits, punctuation, code and a few scripts, fixed so every run gives the
# same files.
TEXT = """The quick brown fox jumps over the lazy dog. It's 12:45 and the 3 cats've eaten 1,234 treats!
Beautiful is better than ugly. Explicit is better than implicit. Simple is better than complex.
def tokenize(text: str) -> list[int]:
    return [ord(c) % 256 for c in text if not c.isspace()]  # 42 == 0x2A
Ünïcödé: naïve café, Straße, нещо на Български, 我想在apple工作, こんにちは, 🦙🚀✅
    for i in range(10):
        print(f"{i:02d}", i ** 2)
"""


def tokenizer_folder(folder: Path, pattern: str, special: list[str], bos, eos, template: str | None,
                     gpt2_class: bool = False) -> None:
    """A byte-level BPE of VOCAB tokens trained on TEXT, saved as a transformers tokenizer in ``folder``."""
    from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.Sequence([pre_tokenizers.Split(Regex(pattern), behavior="isolated"),
                                                 pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)])
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=VOCAB - len(special), initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
                                  show_progress=False)
    tok.train_from_iterator([TEXT] * 4, trainer)
    # padding named (as the end token): the converter writes it, and transformers' Phi-3 config would otherwise keep
    # its default pad id, 32000, outside this vocabulary
    fast = PreTrainedTokenizerFast(tokenizer_object=tok, bos_token=bos, eos_token=eos, pad_token=eos,
                                   chat_template=template)
    fast.add_special_tokens({"additional_special_tokens": [s for s in special if s not in (bos, eos)]})
    fast.save_pretrained(folder)
    if gpt2_class:  # the class the converter's Phi-3 path asks for a BPE vocabulary by (it reads tokenizer.json)
        config_file = folder / "tokenizer_config.json"
        config_file.write_text(json.dumps(json.loads(config_file.read_text()) | {"tokenizer_class": "GPT2Tokenizer"}))


def model_folder(folder: Path, cls_name: str, fields: dict, vocab: int, bos_id, eos_id) -> None:
    import torch
    import transformers

    config_cls = transformers.AutoConfig.for_model(fields["model_type"]).__class__
    skip = {"model_type"} | ({"rope_theta"} if "rope_parameters" in fields else set())  # the theta is in there
    config = config_cls(**{k: v for k, v in fields.items() if k not in skip}, vocab_size=vocab,
                        bos_token_id=bos_id, eos_token_id=eos_id)
    torch.manual_seed(0)
    model = getattr(transformers, cls_name)(config).eval()
    with torch.no_grad():
        for p in model.parameters():  # biases off zero and norm scales off one, so a misplaced one shows
            p.add_(torch.randn_like(p) * 0.05)
    model.save_pretrained(folder)


CONVERT = """
import sys
sys.argv = ["convert_hf_to_gguf.py", *sys.argv[2:]]
import convert_hf_to_gguf
from conversion.base import TextModel
TextModel.get_vocab_base_pre = lambda self, tokenizer: {pre!r}
def no_sentencepiece(self):  # the folders hold no tokenizer.model: what the converter finds when it looks
    raise FileNotFoundError("no tokenizer.model")
TextModel._set_vocab_sentencepiece = no_sentencepiece
convert_hf_to_gguf.main()
"""


# Also converted to Q8_0 (the converter's --outtype q8_0): the families whose files fuse several Linears into one
# tensor, which tformer widens while keeping the others in their blocks.
QUANTIZED = ("phi3", "gpt2")


def convert(llama_cpp: Path, folder: Path, out: Path, pre: str, outtype: str = "f32") -> None:
    env = {"PYTHONPATH": f"{llama_cpp}:{llama_cpp / 'gguf-py'}", "PATH": "/usr/bin:/bin", "HOME": str(Path.home())}
    # named "tiny-<family>" with phi3 as "phi": llama.cpp gives a model whose name holds "phi3" Phi-3's SentencePiece
    # tokens (<s>, </s>, <unk>) attributes by name, which a byte-level vocabulary does not have
    name = "tiny-" + folder.name.replace("phi3", "phi")
    cmd = [sys.executable, "-c", CONVERT.format(pre=pre), "-", str(folder), "--outfile", str(out), "--outtype", outtype,
           "--model-name", name]
    done = subprocess.run(cmd, env=env, cwd=llama_cpp, capture_output=True, text=True)
    if done.returncode:
        raise SystemExit(f"convert_hf_to_gguf.py failed on {folder.name}:\n{done.stderr[-3000:]}")


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--llama-cpp", type=Path, default=DEFAULT_LLAMA_CPP, help="the sdist's vendor/llama.cpp")
    p.add_argument("--families", nargs="+", default=list(FAMILIES), choices=list(FAMILIES))
    args = p.parse_args(argv)
    if not (args.llama_cpp / "convert_hf_to_gguf.py").is_file():
        print(f"no convert_hf_to_gguf.py under {args.llama_cpp}: run bench/build_llamacpp.sh first", file=sys.stderr)
        return 2
    for name in args.families:
        cls_name, fields, pre, pattern, special, bos, eos, template_file = FAMILIES[name]
        template = (args.llama_cpp / "models/templates" / template_file).read_text() if template_file else None
        with tempfile.TemporaryDirectory() as tmp:
            work = Path(tmp) / name
            tokenizer_folder(work, pattern, special, bos, eos, template, gpt2_class=name == "phi3")
            vocab = json.loads((work / "tokenizer.json").read_text())
            ids = {t["content"]: t["id"] for t in vocab["added_tokens"]}
            size = len(vocab["model"]["vocab"]) + len([t for t in vocab["added_tokens"]
                                                       if t["content"] not in vocab["model"]["vocab"]])
            model_folder(work, cls_name, fields, size, ids.get(bos), ids.get(eos))
            out = HERE / f"{name}.gguf"
            convert(args.llama_cpp, work, out, pre)
            if name in QUANTIZED:
                convert(args.llama_cpp, work, HERE / f"{name}-q8_0.gguf", pre, "q8_0")
        print(f"{out.relative_to(HERE.parent.parent)}: {out.stat().st_size:,} bytes (vocabulary {size}, pre {pre})")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
