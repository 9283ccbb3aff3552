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
from safetensors.torch import save_file

from tformer.core.atomic import atomic_dir, existing_dir
from tformer.core.errors import TformerError
from tformer.core.files import FileFormatError
from tformer.interop import checkpoint as model_files
from tformer.train import fsdp
from tformer.train.run_state_check import validate_run_state


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


def load_checkpoint(directory: str | Path, model, optimizer=None, *, sampler: dict | None = None,
                    run_dir: str | Path | None = None, max_lr: float | None = None
                    ) -> tuple[dict[str, Any], dict[str, torch.Tensor]]:
    """Restore weights (and optimizer, RNG) in place; return (state, data-sampler tensors).

    Every field is checked first (tformer.train.run_state_check.validate_run_state, which takes ``sampler``,
    ``run_dir`` and ``max_lr``): a damaged checkpoint is refused in one line with nothing restored.
    """
    found = existing_dir(directory)
    if found is None:
        raise TformerError(f"no checkpoint at {directory}; train first or point --resume at a run's output directory")
    model = model_files.unwrap(model)
    try:
        run = validate_run_state(found, model, optimizer, sampler=sampler,
                                 run_dir=None if run_dir is None else Path(run_dir), max_lr=max_lr)
        if fsdp.is_sharded(model):
            # Every rank reads the full tensors and keeps its own shard.
            fsdp.load_full(model, optimizer, model_files.read_state_dict(found), run.optimizer)
        else:
            model_files.load_weights(model, found)
            if run.optimizer is not None:
                optimizer.load_state_dict(run.optimizer)
    except FileFormatError:
        raise  # already one line naming the file, what is wrong with it and the fix
    except model_files.CorruptCheckpoint as exc:
        raise _corrupt(found, exc.cause) from None
    except (OSError, json.JSONDecodeError, SafetensorError, KeyError, ValueError, RuntimeError) as exc:
        if isinstance(exc, TformerError):
            raise
        raise _corrupt(found, exc) from None
    torch.set_rng_state(run.rng["torch"])
    for key, value in run.rng.items():
        if key.startswith("cuda."):
            torch.cuda.set_rng_state(value, int(key.split(".")[1]))
    random.setstate(run.python_rng)
    np.random.set_state(run.numpy_rng)
    return run.state, run.data


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
