"""interop: Hugging Face config and weights both ways, tformer checkpoints, and the one config loader.

``load_config`` and the config mappings are torch-free and imported here; the names that need
torch (weights, checkpoints) are imported on first use, so `tformer count` never loads torch.
"""

import importlib

from tformer.interop.config import load_config
from tformer.interop.hf_config import config_from_hf, config_to_hf, hf_family

# name -> module that defines it; imported by __getattr__ the first time the name is used
_LAZY = {
    "load_hf": "tformer.interop.hf",
    "save_hf": "tformer.interop.hf",
    "load_checkpoint": "tformer.interop.checkpoint",
    "load_model": "tformer.interop.checkpoint",
    "save_model": "tformer.interop.checkpoint",
}


def __getattr__(name):
    if name not in _LAZY:
        raise AttributeError(f"module 'tformer.interop' has no attribute {name!r}")
    return getattr(importlib.import_module(_LAZY[name]), name)


__all__ = ["load_config", "config_from_hf", "config_to_hf", "hf_family", *_LAZY]
