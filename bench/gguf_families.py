"""llama.cpp reads each GGUF family as tformer does, and reads what tformer writes: the small files llama.cpp's
converter made (scripts/gguf_families) and the same models written back by tformer (`save_gguf`, f32), each scored by
llama-perplexity beside tformer's perplexity on the same tokens (llama.cpp's protocol: chunks of --ctx tokens, the
second half of each scored).

    python bench/gguf_families.py     # llama, llama3, mistral, qwen2, qwen3, phi3, gpt2; needs bench/build_llamacpp.sh's tools

For f32 files the three figures agree within fp32 rounding; a file llama.cpp could not load, or a perplexity that
differs by more than 0.1%, is printed as such and exits 1. Random tiny models score near their vocabulary's size:
what is compared is the number, not its quality.
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
from pathlib import Path

from tformer.interop.gguf_model import load_gguf
from tformer.interop.gguf_write import save_gguf
from tformer.measure.perplexity import perplexity

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from llamacpp import DEFAULT_BIN, llama_perplexity  # noqa: E402  (bench/llamacpp.py)

FILES = Path(__file__).resolve().parent.parent / "scripts" / "gguf_families"
FAMILIES = ("llama", "llama3", "mistral", "qwen2", "qwen3", "phi3", "gpt2")  # phi3 is written back as llama (gguf_families.PHI3)
# A text the tiny tokenizers cover (they learned from much the same), long enough for a few chunks.
TEXT = ("The quick brown fox jumps over the lazy dog. It's 12:45 and the 3 cats've eaten 1,234 treats! "
        "Beautiful is better than ugly. Explicit is better than implicit. Simple is better than complex. "
        "def tokenize(text: str) -> list[int]: return [ord(c) % 256 for c in text] ") * 12


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--llama-cpp", type=Path, default=DEFAULT_BIN, help="the folder of llama.cpp's built tools")
    p.add_argument("--families", nargs="+", default=list(FAMILIES), choices=FAMILIES)
    p.add_argument("--ctx", type=int, default=64)
    args = p.parse_args(argv)
    bad = 0
    print(f"{'family':8}{'tformer':>12}{'llama.cpp':>12}{'llama.cpp on ours':>20}   (perplexity, --ctx {args.ctx})")
    with tempfile.TemporaryDirectory() as tmp:
        text = Path(tmp) / "text.txt"
        text.write_text(TEXT, encoding="utf-8")
        for name in args.families:
            source = FILES / f"{name}.gguf"
            model, tok = load_gguf(source, tokenizer=True)
            ids = tok.encode(TEXT)
            bos = tok.bos_id if getattr(tok, "add_bos", False) else None
            ours = perplexity(model, [bos, *ids] if bos is not None else ids, ctx=args.ctx, bos_id=bos).perplexity
            written = Path(tmp) / f"{name}-tformer.gguf"
            # general.name without "phi3": llama.cpp looks up Phi-3's SentencePiece tokens (<s>, </s>, <unk>) by name
            # in any model so named, which these byte-level vocabularies lack (the converter's file is "tiny-phi")
            model.config = model.config.replace(name=f"tiny-{name}".replace("phi3", "phi"))
            save_gguf(model, written, "f32", tokenizer=tok)
            row = [ours]
            for path in (source, written):
                try:
                    row.append(llama_perplexity(args.llama_cpp, path, text, 0, 2,
                                                ["-c", str(args.ctx), "-b", str(args.ctx)]).get("perplexity"))
                except RuntimeError as exc:
                    row.append(None)
                    print(f"  llama.cpp could not score {path.name}: {str(exc).splitlines()[0][:200]}")
            agree = all(r is not None and abs(r / ours - 1) < 1e-3 for r in row[1:])
            bad += not agree
            print(f"{name:8}" + "".join(f"{r:12.4f}" if r is not None else f"{'-':>12}" for r in row[:2])
                  + (f"{row[2]:20.4f}" if row[2] is not None else f"{'-':>20}") + ("" if agree else "   DIFFER"))
    return 1 if bad else 0


if __name__ == "__main__":
    raise SystemExit(main())
