"""tformer checkpoints: the model part of the format that `tformer train` writes and generate,
translate and export read.

A checkpoint folder holds
    config.json         the ModelConfig (tformer's own names, never a Hugging Face config)
    model.safetensors   the weights (tied tensors stored once)
and whatever else its writer keeps beside them (a run's tokenizer/, the training resume state of
tformer.train.checkpoint). Both files are written atomically, the weights before the config that
describes them, so a crash leaves the previous pair or the new one.
"""

from __future__ import annotations

import json
from pathlib import Path

import torch
from safetensors import SafetensorError
from safetensors import torch as st

from tformer.core.atomic import atomic_files
from tformer.core.config import MAX_CONFIG_BYTES, ModelConfig
from tformer.core.errors import TformerError
from tformer.core.files import FileFormatError, check_tensor_shapes, read_json, read_safetensors_header
from tformer.data import tokenizers
from tformer.interop.hf_config import is_hf_config
from tformer.model import build

CONFIG_FILE = "config.json"
FLOAT_DTYPES = {"F8_E5M2", "F8_E4M3", "F16", "BF16", "F32", "F64"}
WEIGHTS_FILE = "model.safetensors"


class CorruptCheckpoint(TformerError):
    """A checkpoint file that exists but cannot be read; ``path`` and ``cause`` let a caller
    (training resume, say) word its own fix."""

    def __init__(self, message: str, path: Path, cause: BaseException):
        super().__init__(message)
        self.path, self.cause = path, cause


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip()
    return text.splitlines()[0] if text else type(exc).__name__


def unwrap(model):
    """The plain model inside DDP (.module) / torch.compile (._orig_mod) wrappers, where the weights live."""
    while hasattr(model, "module") or hasattr(model, "_orig_mod"):
        model = getattr(model, "_orig_mod", None) or model.module
    return model


# Writing ------------------------------------------------------------------------------------
def save_model(model, directory: str | Path, weights: dict[str, torch.Tensor] | None = None) -> Path:
    """config.json + model.safetensors of ``model`` in ``directory``, keeping the folder's other files.

    ``weights``: full tensors gathered from a sharded (FSDP) model, ties already dropped; default:
    the model's own (safetensors' save_model stores a tied tensor once).
    """
    model = unwrap(model)
    with atomic_files(directory, (WEIGHTS_FILE, CONFIG_FILE)) as stage:
        if weights is None:
            st.save_model(model, str(stage / WEIGHTS_FILE))
        else:
            st.save_file({k: v.contiguous() for k, v in weights.items()}, str(stage / WEIGHTS_FILE),
                      metadata={"format": "pt"})
        (stage / CONFIG_FILE).write_text(json.dumps(model.config.to_dict(), indent=1))
    return Path(directory)


# Reading ------------------------------------------------------------------------------------
def model_dir(path: str | Path) -> Path:
    """The folder holding config.json + model.safetensors: ``path`` itself, or its final/ (older runs)."""
    path = Path(path)
    if not path.is_dir():
        raise TformerError(f"checkpoint directory {path} does not exist; give a training run's --out folder "
                           "or its checkpoint/ folder")
    found = path
    if not (path / WEIGHTS_FILE).is_file() and (path / "final" / WEIGHTS_FILE).is_file():
        found = path / "final"
    if not (found / CONFIG_FILE).is_file() or not (found / WEIGHTS_FILE).is_file():
        raise TformerError(f"{path} has no {CONFIG_FILE} + {WEIGHTS_FILE}; pass a training output folder "
                           "(or --hf for a Hugging Face folder)")
    return found


def read_config(directory: str | Path) -> ModelConfig:
    """The ModelConfig in ``directory``/config.json."""
    path = Path(directory) / CONFIG_FILE
    try:
        data = read_json(path, "checkpoint config", max_bytes=MAX_CONFIG_BYTES, fix="re-export the checkpoint")
    except FileFormatError as exc:
        raise CorruptCheckpoint(str(exc), path, exc) from None
    if is_hf_config(data):
        raise TformerError(f"{directory} holds a Hugging Face config; load it with --hf instead of --ckpt")
    try:
        return ModelConfig.from_dict(data)
    except TformerError as exc:
        raise FileFormatError(f"checkpoint config {path}: {exc}", path) from None


def read_state_dict(directory: str | Path) -> dict[str, torch.Tensor]:
    """Every tensor of ``directory``/model.safetensors, on the CPU (a sharded model keeps its own shard of each)."""
    path = Path(directory) / WEIGHTS_FILE
    try:
        _checked_header(path)
        return st.load_file(str(path))
    except (SafetensorError, RuntimeError, OSError) as exc:
        raise CorruptCheckpoint(f"cannot load {path}: {_first_line(exc)}; is it complete and does "
                                f"{CONFIG_FILE} match it?", path, exc) from None


def _checked_header(path: Path) -> dict[str, dict]:
    """The safetensors header of ``path``, checked against the file's size and dtypes (nothing allocated)."""
    try:
        return read_safetensors_header(path, "checkpoint weights",
                                       fix=f"is it complete and does {CONFIG_FILE} match it?")
    except FileFormatError as exc:
        raise CorruptCheckpoint(str(exc), path, exc) from None


def check_weights_header(model, path: Path) -> None:
    """``path``'s safetensors header against ``model``'s state dict (a meta-device model will do):
    names, shapes and floating dtypes, before any tensor is read. A tied tensor stored once (as
    safetensors' save_model writes it) counts for every name it goes by."""
    header = _checked_header(path)
    state = model.state_dict(keep_vars=True)
    expected = {k: tuple(v.shape) for k, v in state.items() if k in header}
    check_tensor_shapes(path, header, expected, what="checkpoint weights",
                        fix=f"the {CONFIG_FILE} beside it does not match these weights; use the pair saved together")
    stored = {id(state[k]) for k in expected}
    missing = [k for k, v in state.items() if k not in header and id(v) not in stored]
    unexpected = [k for k in header if k not in state]
    if missing or unexpected:
        names = sorted(missing or unexpected)[:3]
        what = "is missing" if missing else "has unexpected"
        raise TformerError(f"{path} {what} tensors {names}; does {CONFIG_FILE} match it?")
    for name in expected:
        if state[name].is_floating_point() and header[name]["dtype"] not in FLOAT_DTYPES:
            raise TformerError(f"{path} stores tensor {name!r} as {header[name]['dtype']}, not a floating-point "
                               f"type; the file is not a model's weights, save it again")


def load_weights(model, directory: str | Path) -> None:
    """Fill ``model`` in place from ``directory``/model.safetensors; every tensor must fit."""
    path = Path(directory) / WEIGHTS_FILE
    model = unwrap(model)
    # Names, shapes and dtypes before anything is read: a tensor the config sizes differently is
    # named here, not as a torch size-mismatch traceback after the file was loaded.
    check_weights_header(model, path)
    try:
        missing, unexpected = st.load_model(model, str(path), strict=False)
    except (SafetensorError, RuntimeError, OSError) as exc:
        raise CorruptCheckpoint(f"cannot load {path}: {_first_line(exc)}; is it complete and does "
                                f"{CONFIG_FILE} match it?", path, exc) from None
    if missing or unexpected:
        names = sorted(missing or unexpected)[:3]  # safetensors returns sets
        what = "is missing" if missing else "has unexpected"
        raise TformerError(f"{path} {what} tensors {names}; does {CONFIG_FILE} match it?")


def load_model(path: str | Path):
    """The model saved in a training output folder (or a checkpoint folder), in eval mode."""
    directory = model_dir(path)
    config = read_config(directory)
    # The meta device gives every tensor's shape without allocating it: a file that does not fit
    # the config is refused before the model's memory is taken.
    check_weights_header(build(config, device="meta", init=False), directory / WEIGHTS_FILE)
    model = build(config, init=False)
    load_weights(model, directory)
    return model.eval()


def find_tokenizer(*dirs: str | Path):
    """The tokenizer `tformer train` saved for a checkpoint: in one of ``dirs``, its tokenizer/
    subfolder or a sibling tokenizer/ folder (first found); None when there is none."""
    for d in map(Path, dirs):
        for candidate in (d, d / "tokenizer", d.parent / "tokenizer"):
            if (candidate / tokenizers.DESCRIPTOR).is_file():
                return tokenizers.load(candidate)
    return None


def load_checkpoint(path: str | Path):
    """(model, tokenizer or None) from a training output folder: what generate, translate and export read."""
    path = Path(path)
    model = load_model(path)
    tokenizer = find_tokenizer(model_dir(path), path)
    # A tokenizer whose ids reach past the embedding table would fail as an index error at the first prompt.
    if tokenizer is not None and tokenizer.vocab_size > model.config.vocab_size:
        raise TformerError(f"the tokenizer saved with {path} has {tokenizer.vocab_size} tokens but the model's "
                           f"vocabulary is {model.config.vocab_size}; the tokenizer belongs to another model: "
                           "restore the one it was trained with")
    return model, tokenizer
