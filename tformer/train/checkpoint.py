"""Training checkpoints: safetensors for tensors, JSON for everything else; written atomically.

Layout of a checkpoint directory:
    config.json         the ModelConfig
    model.safetensors   weights (tied tensors stored once)
    optimizer.safetensors + optimizer.json   optimizer state tensors + hyperparameters
    state.json          step, elapsed time, best validation loss, training arguments
    rng.safetensors     CPU (and CUDA) RNG states and the data sampler's state, for exact resume
"""

from __future__ import annotations

import json
import random
from pathlib import Path
from typing import Any

import numpy as np
import torch
from safetensors import SafetensorError
from safetensors.torch import load_file, load_model, save_file, save_model

from tformer.core.config import ModelConfig
from tformer.core.errors import TformerError
from tformer.core.atomic import atomic_dir, atomic_path, atomic_write_text, existing_dir
from tformer.train import fsdp


def _unwrap(model):
    """The plain model inside DDP / torch.compile wrappers, so checkpoints load anywhere."""
    while True:
        if hasattr(model, "module"):
            model = model.module
        elif hasattr(model, "_orig_mod"):
            model = model._orig_mod
        else:
            return model


def save_weights(model, directory: str | Path, weights: dict[str, torch.Tensor] | None = None) -> None:
    """config.json + model.safetensors in ``directory`` (the final-weights export beside the run's logs).

    Each file is written under a temporary name and renamed, the weights before the config that
    describes them, so a crash leaves either the previous export or the new one, never a torn file.
    ``weights``: full tensors gathered from a sharded (FSDP) model, ties already dropped; default: the model's own.
    """
    model = _unwrap(model)
    with atomic_path(Path(directory) / "model.safetensors") as tmp:
        _write_weights(model, tmp, weights)
    atomic_write_text(Path(directory) / "config.json", json.dumps(model.config.to_dict(), indent=1))


def _write_weights(model, path: Path, weights) -> None:
    if weights is None:
        save_model(model, str(path))
    else:
        save_file({k: v.contiguous() for k, v in weights.items()}, str(path), metadata={"format": "pt"})


def save_checkpoint(directory: str | Path, model, optimizer, state: dict[str, Any],
                    extra_tensors: dict[str, torch.Tensor] | None = None,
                    full_state: tuple[dict, dict] | None = None) -> None:
    """``full_state``: (weights, optimizer state_dict) gathered from an FSDP model (tformer.train.fsdp)."""
    model = _unwrap(model)
    weights, optim_sd = full_state if full_state is not None else (None, optimizer.state_dict())
    opt_tensors, opt_meta = _flatten_optimizer(optim_sd)
    rng = {"torch": torch.get_rng_state()}
    if torch.cuda.is_available():
        for i, s in enumerate(torch.cuda.get_rng_state_all()):
            rng[f"cuda.{i}"] = s
    rng.update({f"data.{k}": v for k, v in (extra_tensors or {}).items()})
    py_state = random.getstate()
    np_state = np.random.get_state()
    with atomic_dir(directory) as tmp:
        (tmp / "config.json").write_text(json.dumps(model.config.to_dict(), indent=1))
        _write_weights(model, tmp / "model.safetensors", weights)
        save_file(opt_tensors, str(tmp / "optimizer.safetensors"))
        (tmp / "optimizer.json").write_text(json.dumps(opt_meta))
        save_file({k: v.contiguous() for k, v in rng.items()}, str(tmp / "rng.safetensors"))
        full_state = {
            **state,
            "python_rng": [py_state[0], list(py_state[1]), py_state[2]],
            "numpy_rng": [np_state[0], np_state[1].tolist(), int(np_state[2]), int(np_state[3]), float(np_state[4])],
        }
        (tmp / "state.json").write_text(json.dumps(full_state, indent=1))


def load_checkpoint(directory: str | Path, model, optimizer=None) -> tuple[dict[str, Any], dict[str, torch.Tensor]]:
    """Restore weights (and optimizer, RNG) in place; return (state, data-sampler tensors)."""
    found = existing_dir(directory)
    if found is None:
        raise TformerError(f"no checkpoint at {directory}; train first or point --resume at a run's output directory")
    model = _unwrap(model)
    try:
        saved_config = ModelConfig.from_dict(json.loads((found / "config.json").read_text()))
        if saved_config != model.config:
            diff = [k for k, v in saved_config.to_dict().items() if model.config.to_dict().get(k) != v and k != "name"]
            if diff:
                raise TformerError(
                    f"checkpoint at {found} was trained with a different model ({', '.join(diff[:4])} differ); "
                    "resume with the same --preset/--set options or start a new --out directory"
                )
        state = json.loads((found / "state.json").read_text())
        rng = load_file(str(found / "rng.safetensors"))
        optim_sd = None
        if optimizer is not None:
            tensors = load_file(str(found / "optimizer.safetensors"))
            meta = json.loads((found / "optimizer.json").read_text())
            optim_sd = _unflatten_optimizer(tensors, meta)
        if fsdp.is_sharded(model):
            # Every rank reads the full tensors and keeps its own shard.
            fsdp.load_full(model, optimizer, load_file(str(found / "model.safetensors")), optim_sd)
        else:
            missing, unexpected = load_model(model, str(found / "model.safetensors"), strict=False)
            if missing or unexpected:
                raise TformerError(f"checkpoint weights do not fit the model (missing {missing[:3]}, "
                                   f"unexpected {unexpected[:3]})")
            if optim_sd is not None:
                optimizer.load_state_dict(optim_sd)
    except (OSError, json.JSONDecodeError, SafetensorError, KeyError, ValueError, RuntimeError) as exc:
        if isinstance(exc, TformerError):
            raise
        raise TformerError(f"checkpoint at {found} is corrupt or incomplete ({type(exc).__name__}: "
                           f"{str(exc).splitlines()[0][:160]}); delete it or resume from another") from None
    torch.set_rng_state(rng["torch"])
    for key, value in rng.items():
        if key.startswith("cuda.") and torch.cuda.is_available():
            torch.cuda.set_rng_state(value, int(key.split(".")[1]))
    py = state.pop("python_rng", None)
    if py is not None:
        random.setstate((py[0], tuple(py[1]), py[2]))
    np_state = state.pop("numpy_rng", None)
    if np_state is not None:
        np.random.set_state((np_state[0], np.array(np_state[1], dtype=np.uint32), *np_state[2:]))
    data = {k[len("data."):]: v for k, v in rng.items() if k.startswith("data.")}
    return state, data


def _flatten_optimizer(sd: dict) -> tuple[dict[str, torch.Tensor], dict]:
    tensors, scalars = {}, {}
    for idx, entries in sd["state"].items():
        for name, value in entries.items():
            if torch.is_tensor(value):
                tensors[f"{idx}.{name}"] = value.detach().contiguous()
            else:
                scalars[f"{idx}.{name}"] = value
    return tensors, {"param_groups": sd["param_groups"], "scalars": scalars}


def _unflatten_optimizer(tensors: dict[str, torch.Tensor], meta: dict) -> dict:
    state: dict[int, dict[str, Any]] = {}
    for key, value in list(tensors.items()) + list(meta["scalars"].items()):
        idx, name = key.split(".", 1)
        state.setdefault(int(idx), {})[name] = value
    return {"state": state, "param_groups": meta["param_groups"]}
