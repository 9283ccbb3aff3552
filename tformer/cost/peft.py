"""What a fine-tuning method costs, from the config and its PeftSpec alone (no torch): trainable and added
parameters, added FLOPs per token, and the peak training memory it predicts.

Memory: every weight (base and added) is held; gradients and the optimizer's state (Adam's two moments, a master
copy under mixed precision) only for the trainable ones; activations from the ledger's saved bytes
(tformer.cost.memory), changed by what the method's backward needs:
    full      the whole ledger's activations
    head      only the head's and the loss's (no backward through the frozen body)
    bitfit    frozen Linears keep no input (a bias's gradient needs none); the rest as full
    lora      a frozen Linear keeps no input (its weight needs no gradient; its input's gradient needs only W);
              a LoRA target keeps its input (A's gradient needs it) and the rank-r product (B's)
    adapter   frozen Linears keep no input; each adapter keeps its input and its two bottleneck tensors
    prompt    the body runs over virtual_tokens more positions (the ledger at seq + virtual_tokens); frozen
              Linears keep no input
    prefix    attention reads virtual_tokens more keys: the score tensors grow by (seq + P) / seq; frozen Linears
              keep no input
The layers before the first trainable module need not keep anything either; that saving is not counted.
"""

from __future__ import annotations

import dataclasses
import difflib
import re

from tformer.core.errors import TformerError
from tformer.core.peft import PeftSpec
from tformer.cost.architecture import Architecture, describe
from tformer.cost.ledger import ledger
from tformer.cost.memory import optimizer_bytes_per_param
from tformer.cost.workload import ACTIVATION_BYTES, Workload

_PLAIN_NAME = re.compile(r"[A-Za-z0-9_.]+")
_SCORES = ("scores", "softmax", "context")  # ops whose saved tensors span the keys


def match_paths(paths: list[str], targets, what: str = "module") -> list[str]:
    """The ``paths`` that ``targets`` names, as peft's target_modules: a name matches a path equal to it or ending
    with "." + name; a single target that is not a plain name is a regular expression full-matched against the
    path. A target that matches nothing is one TformerError naming the closest names."""
    targets = (targets,) if isinstance(targets, str) else tuple(targets)
    if len(targets) == 1 and not _PLAIN_NAME.fullmatch(targets[0]):
        try:
            pattern = re.compile(targets[0])
        except re.error as exc:
            raise TformerError(f"LoRA target {targets[0]!r} is not a valid regular expression ({exc}); "
                               "name modules (q_proj,v_proj) or fix the expression") from None
        found = [p for p in paths if pattern.fullmatch(p)]
        if not found:
            raise TformerError(f"LoRA target expression {targets[0]!r} matches no {what} path; paths look like "
                               f"{paths[0] if paths else '(none)'}; names: {_examples(paths)}")
        return found
    found: list[str] = []
    for target in targets:
        hits = [p for p in paths if p == target or p.endswith("." + target)]
        if not hits:
            raise TformerError(f"LoRA target '{target}' matches no {what}; closest names: {_closest(target, paths)}")
        found += [p for p in hits if p not in found]
    return [p for p in paths if p in found]


def _closest(target: str, paths: list[str]) -> str:
    names = sorted({p.rsplit(".", 1)[-1] for p in paths} | set(paths))
    close = difflib.get_close_matches(target, names, n=4, cutoff=0.3)
    return ", ".join(close) if close else _examples(paths)


def _examples(paths: list[str]) -> str:
    names = sorted({p.rsplit(".", 1)[-1] for p in paths if not p.rsplit(".", 1)[-1].isdigit()})
    return ", ".join(names[:8])


def linears(arch: Architecture) -> dict:
    """Every Linear the model builds, by module path, once (ALBERT's shared layer is one module)."""
    found = []
    for stack in arch.stacks:
        found.append(stack.embed_proj)
        for layer in stack.layers:
            for att in layer.attention:
                found += [att.q, att.k, att.v, att.o]
            found += [layer.mlp.up, layer.mlp.gate, layer.mlp.down]
    found += [arch.pooler, arch.pair_head, arch.classifier]
    if arch.mlm_head:
        found += [arch.mlm_head.dense, arch.mlm_head.decoder]
    if arch.lm_head:
        found.append(arch.lm_head.linear)
    return {lin.path: lin for lin in found if lin is not None}


def _distinct_layers(arch: Architecture) -> list:
    seen: dict[str, object] = {}
    for stack in arch.stacks:
        for layer in stack.layers:
            seen.setdefault(layer.path, layer)
    return list(seen.values())


def lora_targets(config, spec: PeftSpec) -> dict:
    """The Linears a LoRA spec wraps (path -> architecture Linear), checked as apply_peft checks them."""
    every = linears(describe(config))
    paths = match_paths(list(every), spec.targets, what="linear layer")
    for path in paths:
        lin = every[path]
        if not 1 <= spec.rank <= min(lin.d_in, lin.d_out):
            raise TformerError(f"LoRA rank {spec.rank} does not fit '{path}' ({lin.d_out} x {lin.d_in}); "
                               f"choose a rank from 1 to {min(lin.d_in, lin.d_out)}")
    return {p: every[p] for p in paths}


def added_parameters(config, spec: PeftSpec) -> int:
    """Parameters the method adds to the model (LoRA's A and B, adapters, virtual tokens); 0 for full/head/bitfit."""
    arch = describe(config)
    if spec.method == "lora":
        return sum(spec.rank * (lin.d_in + lin.d_out) for lin in lora_targets(config, spec).values())
    if spec.method == "adapter":
        b = spec.bottleneck
        return sum(2 * (2 * layer.mlp.down.d_out * b + b + layer.mlp.down.d_out) for layer in _distinct_layers(arch))
    if spec.method == "prompt":
        return spec.virtual_tokens * arch.tok_embed.shape[1]
    if spec.method == "prefix":
        c = config
        return spec.virtual_tokens * c.n_layers * 2 * c.n_kv_heads * c.head_dim
    return 0


def trainable_parameters(config, spec: PeftSpec) -> int:
    """Parameters that take a gradient under ``spec`` (as tformer.adapt.apply_peft leaves the model)."""
    arch = describe(config)
    params = arch.parameters()
    head = sum(_size(shape) for path, shape in params.items() if path.startswith("head."))
    if spec.method == "full":
        return ledger(config, Workload(phase="forward", batch=1, seq=1)).params["total"]
    if spec.method == "bitfit":
        return sum(_size(shape) for path, shape in params.items() if path.endswith(".bias") or path.startswith("head."))
    return head + added_parameters(config, spec)


def _size(shape) -> int:
    n = 1
    for s in shape:
        n *= s
    return n


def added_flops_per_token(config, spec: PeftSpec, seq: int = 128) -> int:
    """Forward FLOPs per (real) token the method adds: LoRA 2r(in + out) per target; adapters 4 d b each; a prefix
    4 H D P per layer (scores and context over P more keys); a prompt the body's cost of P more positions, spread
    over the ``seq`` real tokens."""
    c = config
    if spec.method == "lora":
        return sum(2 * spec.rank * (lin.d_in + lin.d_out) for lin in lora_targets(config, spec).values())
    if spec.method == "adapter":
        return sum(2 * 2 * 2 * layer.mlp.down.d_out * spec.bottleneck for layer in _distinct_layers(describe(c)))
    if spec.method == "prefix":
        return 4 * c.n_heads * c.head_dim * spec.virtual_tokens * c.n_layers
    if spec.method == "prompt":
        base = ledger(c, Workload(phase="forward", batch=1, seq=seq)).flops["total"]
        more = ledger(c, Workload(phase="forward", batch=1, seq=seq + spec.virtual_tokens)).flops["total"]
        return round((more - base) / seq)
    return 0


def training_memory(config, spec: PeftSpec, workload: Workload) -> dict:
    """Predicted peak training memory in bytes under ``spec``: weights, gradients, optimizer, activations, logits."""
    if workload.phase != "train":
        workload = dataclasses.replace(workload, phase="train")
    base = ledger(config, workload)
    per = optimizer_bytes_per_param(workload)
    total_params = base.params["total"] + added_parameters(config, spec)
    trainable = trainable_parameters(config, spec)
    acts = _activations(config, spec, workload, base)
    out = {"weights": total_params * per["weights"], "gradients": trainable * per["gradients"],
           "optimizer": trainable * (per["master"] + per["moments"]), "activations": acts,
           "logits": base.memory["logits"]}
    out["total"] = sum(out.values())
    return out


def _activations(config, spec: PeftSpec, workload: Workload, base) -> int:
    if spec.method == "full":
        return base.memory["activations"]
    fwd = base.select(phase="forward")
    if spec.method == "head":
        return sum(op.saved_bytes for op in fwd if op.name.startswith(("head", "loss")))
    a = ACTIVATION_BYTES[workload.dtype]
    rows = workload.batch * workload.seq
    kept: set[str] = set()
    extra = 0
    if spec.method == "lora":
        targets = lora_targets(config, spec)
        kept = set(targets) | {p.rsplit(".", 1)[0] + ".q_proj" for p in targets if p.endswith(("k_proj", "v_proj"))}
        extra = sum(rows * spec.rank * a + (rows * lin.d_in if spec.dropout else 0) for lin in targets.values())
    elif spec.method == "adapter":
        for layer in _distinct_layers(describe(config)):
            extra += 2 * rows * (layer.mlp.down.d_out + 2 * spec.bottleneck) * a
    elif spec.method == "prompt":
        fwd = ledger(config, dataclasses.replace(workload, seq=workload.seq + spec.virtual_tokens)).select(
            phase="forward")
    total = 0
    for op in fwd:
        saved = op.saved_bytes
        if op.name.startswith("head"):
            pass  # the head trains: its input stays
        elif op.dims is not None and op.weight_bytes and op.name not in kept:
            saved = 0  # a frozen Linear: no gradient for W, so no saved input
        elif spec.method == "prefix" and op.kind in _SCORES:
            saved = saved * (workload.seq + spec.virtual_tokens) // workload.seq
        total += saved
    return total + extra


def peft_cost(config, spec: PeftSpec, workload: Workload | None = None) -> dict:
    """The ledger's figures for fine-tuning ``config`` with ``spec`` (training memory for ``workload``)."""
    workload = workload or Workload(phase="train", batch=8, seq=128)
    return {"method": spec.method, "trainable": trainable_parameters(config, spec),
            "added": added_parameters(config, spec),
            "added_flops_per_token": added_flops_per_token(config, spec, workload.seq),
            "memory": training_memory(config, spec, workload)}


__all__ = ["added_flops_per_token", "added_parameters", "linears", "lora_targets", "match_paths", "peft_cost",
           "trainable_parameters", "training_memory"]
