"""Training checkpoints: the model part in tformer's checkpoint format (tformer.interop.checkpoint),
plus what resuming needs; safetensors for tensors, JSON for everything else; written atomically.

Layout of a checkpoint directory:
    config.json         the ModelConfig                        } tformer.interop.checkpoint
    model.safetensors   weights (tied tensors stored once)     }
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
from safetensors.torch import load_file, save_file

from tformer.core.atomic import atomic_dir, existing_dir
from tformer.core.errors import TformerError
from tformer.core.files import FileFormatError, read_json, read_safetensors_header
from tformer.interop import checkpoint as model_files
from tformer.train import fsdp


def save_weights(model, directory: str | Path, weights: dict[str, torch.Tensor] | None = None) -> None:
    """config.json + model.safetensors in ``directory`` (the final-weights export beside the run's logs).

    ``weights``: full tensors gathered from a sharded (FSDP) model, ties already dropped; default: the model's own.
    """
    model_files.save_model(model, directory, weights)


def save_checkpoint(directory: str | Path, model, optimizer, state: dict[str, Any],
                    extra_tensors: dict[str, torch.Tensor] | None = None,
                    full_state: tuple[dict, dict] | None = None) -> None:
    """``full_state``: (weights, optimizer state_dict) gathered from an FSDP model (tformer.train.fsdp)."""
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
        model_files.save_model(model, tmp, weights)
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
    model = model_files.unwrap(model)
    try:
        saved_config = model_files.read_config(found)
        if saved_config != model.config:
            diff = [k for k, v in saved_config.to_dict().items() if model.config.to_dict().get(k) != v and k != "name"]
            if diff:
                raise TformerError(
                    f"checkpoint at {found} was trained with a different model ({', '.join(diff[:4])} differ); "
                    "resume with the same --preset/--set options or start a new --out directory"
                )
        state = _read_json(found / "state.json")
        rng = _load_tensors(found / "rng.safetensors")
        optim_sd = None
        if optimizer is not None:
            tensors = _load_tensors(found / "optimizer.safetensors")
            meta = _read_json(found / "optimizer.json")
            optim_sd = _unflatten_optimizer(tensors, meta)
        if fsdp.is_sharded(model):
            # Every rank reads the full tensors and keeps its own shard.
            fsdp.load_full(model, optimizer, model_files.read_state_dict(found), optim_sd)
        else:
            model_files.load_weights(model, found)
            if optim_sd is not None:
                optimizer.load_state_dict(optim_sd)
    except FileFormatError:
        raise  # already one line naming the file, what is wrong with it and the fix
    except model_files.CorruptCheckpoint as exc:
        raise _corrupt(found, exc.cause) from None
    except (OSError, json.JSONDecodeError, SafetensorError, KeyError, ValueError, RuntimeError) as exc:
        if isinstance(exc, TformerError):
            raise
        raise _corrupt(found, exc) from None
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


def _load_tensors(path: Path) -> dict[str, torch.Tensor]:
    """A checkpoint's tensors, its header checked first: a damaged file (or a pickle put in its place)
    is named before any of it is read."""
    read_safetensors_header(path, "checkpoint file", fix="delete the checkpoint or resume from another")
    return load_file(str(path))


def _read_json(path: Path) -> dict:
    # the numpy RNG state is a list of 624 numbers: large but flat
    return read_json(path, "checkpoint file", max_bytes=64 << 20, fix="delete the checkpoint or resume from another")


def _corrupt(found: Path, exc: BaseException) -> TformerError:
    return TformerError(f"checkpoint at {found} is corrupt or incomplete ({type(exc).__name__}: "
                        f"{str(exc).splitlines()[0][:160] if str(exc) else ''}); delete it or resume from another")


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
