"""tformer's GGUF tokenizers against llama.cpp's own tokenizer tests: the vocabulary-only GGUF files in the
llama-cpp-python sdist's vendor/llama.cpp/models (real vocabularies: Qwen2's, GPT-2's, LLaMA 3's, Phi-3's), each with
llama.cpp's test texts (.inp: whitespace runs, digits, accents, emoji, code, several scripts) and the ids llama.cpp's
tokenizer gives them (.out).

    python bench/llamacpp_vocab.py                       # every vocabulary below
    python bench/llamacpp_vocab.py --vocab qwen2 phi-3

Prints, per vocabulary, its pre-tokenizer, the texts and the texts whose ids differ (the first few shown); exit 1
when any differs. Reads the sdist unpacked by bench/build_llamacpp.sh; nothing is built or run.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from tformer.interop.gguf_file import open_gguf
from tformer.interop.gguf_tokenizer import tokenizer_from_gguf

MODELS = Path.home() / ".cache/llamacpp/llama_cpp_python-0.3.36/vendor/llama.cpp/models"
VOCABS = ("qwen2", "gpt-2", "llama-bpe", "phi-3", "llama-spm")
SEPARATOR = "\n__ggml_vocab_test__\n"  # between the .inp file's texts (llama.cpp's tests/test-tokenizer-0)


def cases(name: str, models: Path) -> list[tuple[str, list[int]]]:
    texts = (models / f"ggml-vocab-{name}.gguf.inp").read_text(encoding="utf-8").split(SEPARATOR)
    ids = (models / f"ggml-vocab-{name}.gguf.out").read_text(encoding="utf-8").split("\n")
    texts = texts[:-1] if texts and texts[-1] == "" else texts
    return [(text, [int(x) for x in line.split()]) for text, line in zip(texts, ids)]


def check(name: str, models: Path) -> int:
    with open_gguf(models / f"ggml-vocab-{name}.gguf") as f:
        tok = tokenizer_from_gguf(f.metadata)
    bad = []
    for text, want in cases(name, models):
        got = tok.encode(text)
        if got[:1] == [tok.bos_id] and want[:1] != [tok.bos_id]:  # llama.cpp's test tokenizes without BOS
            got = got[1:]
        if got != want:
            bad.append((text, got, want))
    total = len(cases(name, models))
    print(f"{name:10} pre {getattr(tok, 'pre', 'sentencepiece'):14} {total} texts, {len(bad)} differ")
    for text, got, want in bad[:3]:
        print(f"    {text[:40]!r}: tformer {got[:10]} llama.cpp {want[:10]}")
    return len(bad)


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--vocab", nargs="+", default=list(VOCABS), choices=VOCABS)
    p.add_argument("--models", type=Path, default=MODELS, help="llama.cpp's models/ folder")
    args = p.parse_args(argv)
    if not args.models.is_dir():
        print(f"no {args.models}: run bench/build_llamacpp.sh first (it unpacks the sdist)", file=sys.stderr)
        return 2
    return 1 if sum(check(name, args.models) for name in args.vocab) else 0


if __name__ == "__main__":
    raise SystemExit(main())
