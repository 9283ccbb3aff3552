"""A checkpoint's optimizer state (optimizer.json + optimizer.safetensors) checked against the optimizer it
is about to be loaded into, before load_state_dict sees it.

torch's load_state_dict checks the number of groups and parameters, little else: a negative epsilon, a
moment of the wrong shape or a group with maximize=true would load and train the run backwards or end in
a traceback mid-step. The saved hyper-parameters must be the ones this run's flags give (they never
change on resume); the learning rate, which the schedule sets before every step, must lie within it.
"""

from __future__ import annotations

import torch

from tformer.core.files import read_json
from tformer.train.field_check import OPTIM_META, OPTIM_TENSORS, STATE_FILE, Check, describe, kind, load_tensors, show

MAX_META_BYTES = 64 << 20
# Set from the run's flags; a saved value that differs belongs to another run (or a hand edit).
FLAG_KEYS = ("betas", "eps", "weight_decay", "momentum", "dampening", "nesterov", "amsgrad", "maximize",
             "decoupled_weight_decay")
# Read by Optimizer.step without a default: a group without one would stop the run mid-step.
REQUIRED_KEYS = ("lr", "betas", "eps", "weight_decay", "momentum", "dampening", "nesterov")
# How a kernel is chosen, not what it computes: an older checkpoint keeps its own choice.
KERNEL_KEYS = ("foreach", "fused", "capturable", "differentiable")
SQUARES = ("exp_avg_sq", "max_exp_avg_sq")  # running means of squared gradients: never negative


def optimizer_state(check: Check, optimizer, step: int, max_lr: float | None) -> dict:
    """The checkpoint's optimizer state_dict for ``optimizer``, every group and tensor checked.

    step: the run's step (state.json), which no parameter's own count of updates may pass. max_lr: the
    run's --lr, the most any schedule gives (None: no bound but finite and not negative).
    """
    meta = read_json(check.folder / OPTIM_META, "checkpoint file", max_bytes=MAX_META_BYTES, fix=check.fix)
    for key, want in (("param_groups", list), ("scalars", dict)):
        if not isinstance(meta.get(key), want):
            check.fail(OPTIM_META, key, "is missing" if key not in meta else
                       f"is {kind(meta[key])}, not {'a list' if want is list else 'a JSON object'}")
    groups, live = meta["param_groups"], optimizer.param_groups
    if len(groups) != len(live):
        check.fail(OPTIM_META, "param_groups", f"holds {len(groups)} groups but this run's optimizer has {len(live)}; "
                   "the checkpoint is not this run's")
    params, group_of = {}, {}  # saved parameter number -> the live parameter it is loaded into (paired in order), its group
    for g, (saved, own) in enumerate(zip(groups, live)):
        where = f"param_groups[{g}]"
        if not isinstance(saved, dict):
            check.fail(OPTIM_META, where, f"is {kind(saved)}, not a JSON object")
        ids = saved.get("params")
        if not (isinstance(ids, list) and all(type(i) is int and i >= 0 for i in ids)):
            check.fail(OPTIM_META, f"{where}.params", f"is {show(ids)}, not a list of parameter numbers")
        if len(ids) != len(own["params"]):
            check.fail(OPTIM_META, f"{where}.params", f"holds {len(ids)} parameters but this model's group has "
                       f"{len(own['params'])}; the checkpoint is not this model's")
        for i, p in zip(ids, own["params"]):
            if i in params:
                check.fail(OPTIM_META, f"{where}.params", f"names parameter {i} a second time")
            params[i], group_of[i] = p, own
        _hyperparameters(check, where, saved, own, max_lr)
    state: dict[int, dict] = {}
    tensors = load_tensors(check, OPTIM_TENSORS)
    for key, value in [*tensors.items(), *meta["scalars"].items()]:
        number, _, name = key.partition(".")
        if not (number.isdigit() and name and int(number) in params):
            check.fail(OPTIM_TENSORS if key in tensors else OPTIM_META, key, "belongs to no parameter of any group")
        state.setdefault(int(number), {})[name] = value
    for number, entries in state.items():
        names = _state_names(optimizer, group_of[number])
        _parameter_state(check, number, entries, params[number], step, names)
    return {"state": state, "param_groups": groups}


def _hyperparameters(check: Check, where: str, saved: dict, own: dict, max_lr: float | None) -> None:
    for key in REQUIRED_KEYS:
        if key in own and key not in saved:
            check.fail(OPTIM_META, f"{where}.{key}", "is missing")
    lr = check.number(OPTIM_META, f"{where}.lr", saved["lr"])
    if max_lr is not None and lr > max_lr * (1 + 1e-6):  # the slack: lr * step / warmup rounds
        check.fail(OPTIM_META, f"{where}.lr", f"is {show(saved['lr'])}, above the run's --lr {max_lr:g}, the most "
                   "its schedule ever gives")
    for key in FLAG_KEYS:
        if key not in saved or key not in own:
            continue
        field, value = f"{where}.{key}", saved[key]
        if isinstance(own[key], bool):
            if not isinstance(value, bool):
                check.fail(OPTIM_META, field, f"is {kind(value)}, not true or false")
        elif key == "betas":
            if not (isinstance(value, list) and len(value) == 2):
                check.fail(OPTIM_META, field, f"is {kind(value)}, not a pair of numbers")
            for k, beta in enumerate(value):
                check.number(OPTIM_META, f"{field}[{k}]", beta, 0.0, 1.0, below=True)
        else:
            check.number(OPTIM_META, field, value)
        if _plain(value) != _plain(own[key]):
            check.fail(OPTIM_META, field, f"is {show(value)} but this run's flags give {show(_plain(own[key]))}; "
                       "the checkpoint is not this run's")
    for key in KERNEL_KEYS:
        if key in saved and not (saved[key] is None or isinstance(saved[key], bool)):
            check.fail(OPTIM_META, f"{where}.{key}", f"is {kind(saved[key])}, not true, false or null")


def _plain(value):
    """A hyper-parameter as JSON holds it: betas are a tuple in the optimizer, a list in the file."""
    return list(value) if isinstance(value, tuple) else value


def _state_names(optimizer, group: dict) -> set[str] | None:
    """What the optimizer keeps per parameter once it has stepped it; None for an optimizer not known here."""
    if isinstance(optimizer, (torch.optim.Adam, torch.optim.AdamW)):
        return {"step", "exp_avg", "exp_avg_sq"} | ({"max_exp_avg_sq"} if group.get("amsgrad") else set())
    if isinstance(optimizer, torch.optim.SGD):
        return {"momentum_buffer"} if group.get("momentum") else set()
    return None


def _parameter_state(check: Check, number: int, entries: dict, param, step: int, names: set[str] | None) -> None:
    if names is not None and set(entries) != names:
        missing, extra = sorted(names - set(entries)), sorted(set(entries) - names)
        field = f"{number}.{(missing or extra)[0]}"
        check.fail(OPTIM_TENSORS, field, "is missing" if missing else "is no part of this optimizer's state")
    for name, value in entries.items():
        field = f"{number}.{name}"
        if not torch.is_tensor(value):
            count = check.number(OPTIM_META, field, value)
        else:
            if not value.is_floating_point():
                check.fail(OPTIM_TENSORS, field, f"is a {describe(value)} tensor, not floating point")
            if name != "step" and tuple(value.shape) != tuple(param.shape):
                check.fail(OPTIM_TENSORS, field, f"has shape {list(value.shape)} but parameter {number} of this "
                           f"model has {list(param.shape)}; the checkpoint is not this model's")
            if name == "step" and value.numel() != 1:
                check.fail(OPTIM_TENSORS, field, f"is a {describe(value)} tensor, not one count")
            if not torch.isfinite(value).all():
                check.fail(OPTIM_TENSORS, field, "holds NaN or infinite values")
            if name in SQUARES and (value < 0).any():
                check.fail(OPTIM_TENSORS, field, "holds negative values (a mean of squares)")
            count = value.item() if name == "step" else 0.0
        if name == "step" and not (count == int(count) and 0 <= count <= step):
            check.fail(OPTIM_TENSORS if torch.is_tensor(value) else OPTIM_META, field,
                       f"is {count:g} updates, not a whole number from 0 to the run's {step} steps ({STATE_FILE} step)")

