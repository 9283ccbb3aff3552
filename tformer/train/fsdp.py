"""FSDP2 (``fully_shard``): each rank keeps 1/N of every weight, gradient and optimizer moment.

For models that do not fit one device. Checkpoints stay in the plain single-process format
(full weights, index-keyed optimizer state), gathered on every rank and written by rank 0, so an
FSDP run resumes without FSDP and its weights load into a plain model.
"""

from __future__ import annotations

import contextlib

from safetensors.torch import _remove_duplicate_names

from tformer.model.blocks import Block


def shard(model, reshard_after_forward: bool = True) -> None:
    """Shard in place: one FSDP unit per transformer Block, then the root.

    reshard_after_forward: True frees each Block's gathered weights after its forward and gathers them
    again for backward (ZeRO-3, FSDP's full_shard); False keeps them whole from forward until backward
    ends (ZeRO-2, shard_grad_op), one all-gather per step fewer at the cost of whole weights in memory.
    """
    # deferred: torch.distributed loads only for distributed runs
    from torch.distributed.fsdp import fully_shard

    # Record which tensors are tied (embedding = output head) while they are still plain tensors:
    # checkpoints store a tied tensor once, under the name safetensors' save_model keeps.

    model._tformer_tied = {kept: list(dropped) for kept, dropped in _remove_duplicate_names(model.state_dict()).items()}
    for module in list(model.modules()):
        if isinstance(module, Block):
            fully_shard(module, reshard_after_forward=reshard_after_forward)
    # the rest (embeddings, final norm, head) in one unit, so ties stay inside it
    fully_shard(model, reshard_after_forward=reshard_after_forward)


def is_sharded(model) -> bool:
    return hasattr(model, "_tformer_tied")


def grad_sync(model, enabled: bool):
    """FSDP's no_sync: skip the reduce-scatter on all but the last micro-batch of an accumulation."""
    model.set_requires_gradient_sync(enabled)
    return contextlib.nullcontext()


def _options():
    # deferred: torch.distributed loads only for distributed runs
    from torch.distributed.checkpoint.state_dict import StateDictOptions

    # Full (unsharded) tensors on CPU; only rank 0 receives them, the others get empty dicts.
    return StateDictOptions(full_state_dict=True, cpu_offload=True)


def _param_names(model, optimizer) -> list[str]:
    """Names of the optimizer's parameters in its own order: index i of a plain optimizer state_dict."""
    name_of = {id(p): n for n, p in model.named_parameters()}
    return [name_of[id(p)] for group in optimizer.param_groups for p in group["params"]]


def full_state(model, optimizer) -> tuple[dict, dict | None]:
    """(weights, optimizer state_dict) in the single-process format; collective, call on every rank."""
    # deferred: torch.distributed loads only for distributed runs
    from torch.distributed.checkpoint.state_dict import get_model_state_dict, get_optimizer_state_dict

    weights = get_model_state_dict(model, options=_options())
    for dropped in model._tformer_tied.values():
        for name in dropped:
            weights.pop(name, None)
    if optimizer is None:
        return weights, None
    by_name = get_optimizer_state_dict(model, optimizer, options=_options())
    if not by_name:
        return weights, None  # not rank 0
    index = {name: i for i, name in enumerate(_param_names(model, optimizer))}
    groups = [{**g, "params": [index[n] for n in g["params"]]} for g in by_name["param_groups"]]
    return weights, {"state": {index[n]: s for n, s in by_name["state"].items()}, "param_groups": groups}


def load_full(model, optimizer, weights: dict, optim_sd: dict | None) -> None:
    """Inverse of full_state: every rank passes the full tensors (read from the checkpoint) and keeps its shard."""
    # deferred: torch.distributed loads only for distributed runs
    from torch.distributed.checkpoint.state_dict import StateDictOptions, set_model_state_dict, set_optimizer_state_dict

    options = StateDictOptions(full_state_dict=True)
    weights = dict(weights)
    for kept, dropped in model._tformer_tied.items():
        for name in dropped:
            weights.setdefault(name, weights[kept])
    set_model_state_dict(model, weights, options=options)
    if optimizer is not None and optim_sd is not None:
        names = _param_names(model, optimizer)
        by_name = {"state": {names[int(i)]: s for i, s in optim_sd["state"].items()},
                   "param_groups": [{**g, "params": [names[int(i)] for i in g["params"]]}
                                    for g in optim_sd["param_groups"]]}
        set_optimizer_state_dict(model, optimizer, by_name, options=options)
