"""tformer: the Transformer family as readable, tested software, with the arithmetic of running it."""

__version__ = "0.1.0"

from tformer.core.config import ModelConfig, preset, preset_names  # noqa: E402
from tformer.core.errors import TformerError  # noqa: E402


def build_model(config, device=None, dtype=None):
    """The nn.Module for ``config`` (a ModelConfig or a preset name)."""
    from tformer.model import build

    if isinstance(config, str):
        config = preset(config)
    return build(config, device=device, dtype=dtype)


def load_hf(path, **kwargs):
    """Build our model from a local Hugging Face-format directory."""
    from tformer.interop.hf import load_hf as _load

    return _load(path, **kwargs)


def save_hf(model, path, **kwargs):
    """Write ``model`` as a Hugging Face-format directory that ``transformers`` loads."""
    from tformer.interop.hf import save_hf as _save

    return _save(model, path, **kwargs)


__all__ = ["ModelConfig", "preset", "preset_names", "build_model", "load_hf", "save_hf", "TformerError", "__version__"]
