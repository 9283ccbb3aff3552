"""A tiny random checkpoint folder (config.json + model.safetensors, and a character tokenizer when asked), as a
training run leaves it: what the generate / translate / serve tests load. Not a test module itself.

The weights are perturbed well away from the initialisation so that greedy outputs differ from step to step
(a freshly initialised tiny model tends to repeat one token, which would hide an off-by-one)."""

from __future__ import annotations

import json

import torch
from safetensors.torch import save_model

from tformer.core.config import ModelConfig
from tformer.data.tokenizers import CharTokenizer
from tformer.model import build


def write_checkpoint(path, arch: str, tokenizer: bool, text: str, max_positions: int, **kw):
    """Write the checkpoint into the new folder ``path``; the tokenizer (when asked) covers ``text``'s characters."""
    tok = CharTokenizer.from_text(text, specials={"pad": "<pad>", "bos": "<s>", "eos": "</s>"}) if tokenizer else None
    config = ModelConfig(arch=arch, n_layers=2, d_model=32, n_heads=4, d_ff=64,
                         vocab_size=tok.vocab_size if tok else 40, max_positions=max_positions, tied_embeddings=False,
                         **kw)
    torch.manual_seed(0)
    model = build(config)
    with torch.no_grad():
        for p in model.parameters():
            p.add_(torch.randn_like(p) * 0.3)
    path.mkdir(parents=True)
    (path / "config.json").write_text(json.dumps(config.to_dict()))
    save_model(model, str(path / "model.safetensors"))
    if tok is not None:
        tok.save(path)
    return path
