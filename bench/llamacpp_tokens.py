"""tformer's tokenizer from a GGUF file against llama.cpp's own, token for token, on Shakespeare (train +
validation) and WikiText-2's test split: llama-server's /tokenize on the same file (no special tokens added).

    python bench/llamacpp_tokens.py                      # Gemma 3 270M (SentencePiece, tformer.interop.gguf_spm)
    python bench/llamacpp_tokens.py --gguf smollm2-135m-instruct   # SmolLM2 (byte-level BPE)

The tests hold tformer's SentencePiece tokenizer to transformers' GGUF tokenizer and to llama.cpp's algorithm
written out in Python; this asks the engine itself. Texts are sent in pieces cut after runs of line breaks (whole
user-defined tokens, so the pieces' ids are the text's ids), and every piece whose ids differ is counted.
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

from tformer.data.corpora import get_corpus
from tformer.interop.gguf_config import resolve_gguf
from tformer.interop.gguf_file import open_gguf
from tformer.interop.gguf_tokenizer import tokenizer_from_gguf

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from llamacpp import DEFAULT_BIN, tool  # noqa: E402  (bench/llamacpp.py: the built tools' folder)

PIECE_CHARS = 200_000  # about what one /tokenize request carries comfortably


def lines(text: str) -> list[str]:
    """Cut after each run of line breaks (to localise a difference)."""
    out, start, i = [], 0, 0
    while i < len(text):
        if text[i] == "\n":
            while i < len(text) and text[i] == "\n":
                i += 1
            out.append(text[start:i])
            start = i
            continue
        i += 1
    return out + ([text[start:]] if start < len(text) else [])


def pieces(text: str) -> list[str]:
    """Whole lines joined into pieces of about PIECE_CHARS."""
    out, current = [], ""
    for line in lines(text):
        current += line
        if len(current) >= PIECE_CHARS:
            out.append(current)
            current = ""
    return out + ([current] if current else [])


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def tokenize(port: int, text: str) -> list[int]:
    body = json.dumps({"content": text, "add_special": False, "parse_special": False}).encode()
    req = urllib.request.Request(f"http://127.0.0.1:{port}/tokenize", body, {"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=600) as r:
        return json.loads(r.read())["tokens"]


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--gguf", default="gemma3-270m")
    p.add_argument("--llama-cpp", type=Path, default=DEFAULT_BIN)
    args = p.parse_args(argv)
    path = resolve_gguf(args.gguf)
    with open_gguf(path) as f:
        tok = tokenizer_from_gguf(f.metadata)
    port = free_port()
    server = subprocess.Popen([tool(args.llama_cpp, "llama-server"), "-m", str(path), "--port", str(port), "-t", "1",
                               "-c", "512"], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        for _ in range(600):
            try:
                urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=1)
                break
            except OSError:
                time.sleep(0.5)
        shakespeare = get_corpus("shakespeare")
        for name, text in (("shakespeare", shakespeare.text("train") + shakespeare.text("validation")),
                           ("wikitext2-test", get_corpus("wikitext2").text("test"))):
            ours_total = theirs_total = 0
            differing, examples = 0, []
            for piece in pieces(text):
                ours, theirs = tok.encode(piece), tokenize(port, piece)
                ours_total, theirs_total = ours_total + len(ours), theirs_total + len(theirs)
                if ours == theirs:
                    continue
                for line in lines(piece):  # localise: which lines differ
                    a, b = tok.encode(line), tokenize(port, line)
                    if a != b:
                        differing += 1
                        if len(examples) < 3:
                            examples.append(line[:80])
            print(json.dumps({"corpus": name, "file": path.name, "tokens_tformer": ours_total,
                              "tokens_llama_cpp": theirs_total, "differing_lines": differing,
                              "examples": examples}), flush=True)
    finally:
        server.terminate()
        server.wait(timeout=30)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
