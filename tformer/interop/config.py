"""The one config loader: a preset name, a JSON file or a model folder -> ModelConfig.

Torch-free on purpose: `tformer count` and `tformer scale` read configs through here and must
not pay for importing torch.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Iterable, Mapping

from tformer.core.config import PRESETS, ModelConfig, preset, read_config_json
from tformer.core.errors import TformerError
from tformer.data.gguf_models import PACKAGED_GGUF
from tformer.interop.hf_config import config_from_hf, is_hf_config

CONFIG_FILE = "config.json"


def load_config(source: str | Path, overrides: Iterable[str] | Mapping[str, Any] | None = None) -> ModelConfig:
    """The ModelConfig that ``source`` names.

    ``source``: a preset name ("gpt2"); a GGUF file or a packaged GGUF model's name (its metadata); a JSON
    file, either a tformer config or a Hugging Face config.json (told apart by HF's model_type key); or a
    folder holding config.json (a Hugging Face model folder, a tformer checkpoint or training run; older
    runs kept it in final/).
    ``overrides``: CLI-style ``key=value`` strings or a dict of fields, applied last.
    """
    config = _load(source)
    if not overrides:
        return config
    if isinstance(overrides, Mapping):
        return config.replace(**overrides)
    return config.with_overrides(list(overrides))


def _load(source: str | Path) -> ModelConfig:
    if isinstance(source, str) and source in PRESETS:
        return preset(source)
    path = Path(source).expanduser()
    if path.suffix == ".gguf" or (isinstance(source, str) and source in PACKAGED_GGUF):
        # deferred: numpy and the GGUF reader only for a GGUF source (the cost commands stay light)
        from tformer.interop.gguf_config import config_from_gguf

        return config_from_gguf(source)
    if not path.exists():
        if isinstance(source, str) and "/" not in source and not path.suffix:
            return preset(source)  # an unknown preset: the error names the closest one
        raise TformerError(f"config file {path} does not exist; pass a preset name, a JSON config file "
                           "or a model folder")
    if path.is_dir():
        folder = path
        path = folder / CONFIG_FILE
        if not path.is_file() and (folder / "final" / CONFIG_FILE).is_file():
            path = folder / "final" / CONFIG_FILE
        if not path.is_file():
            raise TformerError(f"{folder} has no {CONFIG_FILE}; pass a Hugging Face model folder, a tformer "
                               "checkpoint or training output folder, or a config file")
    data = read_config_json(path)
    try:
        return config_from_hf(data) if is_hf_config(data) else ModelConfig.from_dict(data)
    except TformerError as exc:
        raise TformerError(f"{path}: {exc}") from None
