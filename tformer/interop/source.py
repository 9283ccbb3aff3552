"""A model and its tokenizer from a training output (--ckpt) or a Hugging Face folder (--hf).

What `tformer generate`, `translate` and `serve` load: one loader, so each reads a checkpoint the same way.
"""

from __future__ import annotations

from pathlib import Path

from tformer.core.errors import TformerError
from tformer.data.weights import checkpoint_dir
from tformer.interop.checkpoint import load_checkpoint
from tformer.interop.hf import load_hf


class HFTokenizerAdapter:
    """HF `tokenizers` Tokenizer behind the same encode/decode calls as tformer's tokenizers."""

    def __init__(self, tok):
        # Checkpoints ship tokenizer.json with padding/truncation to a model length (MiniLM: 128);
        # left on, every prompt would come back padded to it.
        tok.no_padding()
        tok.no_truncation()
        self.tok = tok

    def encode(self, text, add_special_tokens: bool = False):
        return self.tok.encode(text, add_special_tokens=add_special_tokens).ids

    def decode(self, ids, skip_special=False):
        return self.tok.decode(list(ids), skip_special_tokens=skip_special)


def hf_tokenizer(directory: Path) -> HFTokenizerAdapter | None:
    """The tokenizer.json of a Hugging Face folder, or None when it has none."""
    path = Path(directory) / "tokenizer.json"
    if not path.is_file():
        return None
    # deferred: the tokenizer library loads only for the tokenizer that needs it
    from tokenizers import Tokenizer

    try:
        return HFTokenizerAdapter(Tokenizer.from_file(str(path)))
    except Exception as exc:  # the library raises its own exception type for a malformed file
        raise TformerError(f"cannot read {path}: {str(exc).splitlines()[0]}") from None


def load_source(ckpt: str | None = None, hf: str | None = None):
    """(model, tokenizer or None, a label for the output) from a checkpoint folder or an HF folder."""
    if hf:
        model = load_hf(hf)
        directory = checkpoint_dir(hf)
        return model, hf_tokenizer(directory.parent if directory.is_file() else directory), str(hf)
    if not ckpt:
        raise TformerError("pass --ckpt DIR or --hf DIR")
    model, tokenizer = load_checkpoint(Path(ckpt))
    return model, tokenizer, str(ckpt)


__all__ = ["HFTokenizerAdapter", "hf_tokenizer", "load_source"]
