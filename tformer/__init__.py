"""tformer: the Transformer family as readable, tested software, with the arithmetic of running it."""

__version__ = "0.1.0"

import importlib

from tformer.core.config import ModelConfig, preset, preset_names
from tformer.core.errors import TformerError
from tformer.interop.config import load_config

# `import tformer` stays torch-free: these names load their modules (and torch) on first use.
_LAZY = {"load_hf": "tformer.interop.hf", "save_hf": "tformer.interop.hf", "load_gguf": "tformer.interop.gguf_model"}


def build_model(config, device=None, dtype=None):
    """The nn.Module for ``config`` (a ModelConfig or a preset name)."""
    from tformer.model import build  # deferred: torch is imported only when a model is built

    return build(preset(config) if isinstance(config, str) else config, device=device, dtype=dtype)


def __getattr__(name):
    if name not in _LAZY:
        raise AttributeError(f"module 'tformer' has no attribute {name!r}")
    return getattr(importlib.import_module(_LAZY[name]), name)


__all__ = ["ModelConfig", "TformerError", "__version__", "build_model", "load_config", "load_gguf", "load_hf", "preset",
           "preset_names", "save_hf"]
