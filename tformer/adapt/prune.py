"""Pruning: zero the smallest weights (unstructured), or remove whole attention heads and FFN neurons (structured).

Unstructured magnitude pruning (Han et al. 2015) keeps the shapes: the zeros save nothing with dense kernels, only
storage once compressed. Structured pruning removes heads (Michel, Levy & Neubig 2019) and FFN neurons and builds a
new, smaller model whose config says so, so the ledger recounts its parameters and FLOPs from that config. The config
holds one n_heads and one d_ff for every layer, so every layer loses the same number, each its own least important.
Every function returns a new model; the one given is left unchanged.
"""

from __future__ import annotations

import copy
import re

import torch
from torch import nn

from tformer.core.errors import TformerError
from tformer.model import build, runner_for
from tformer.model.attention import MultiHeadAttention
from tformer.model.feedforward import FeedForward

PRUNABLE_ARCHS = ("decoder", "encoder", "encoder-decoder", "vit")
HEAD_MODULES = re.compile(r"(^|\.)(lm_head|head|pooler|mlm_head|pair_head)(\.|$)")
IMPORTANCE = ("weight", "gradient")


def _check_arch(model, what: str) -> None:
    arch = model.config.arch
    if arch not in PRUNABLE_ARCHS:
        raise TformerError(f"{what} prunes a Transformer's layers; arch '{arch}' has none "
                           f"(prune one of: {', '.join(PRUNABLE_ARCHS)})")


def _check_fraction(name: str, value: float) -> None:
    if not (isinstance(value, (int, float)) and 0.0 <= value < 1.0):
        raise TformerError(f"{name} must be a fraction in [0, 1) (0.5 = half), got {value!r}")


# Unstructured ---------------------------------------------------------------------------------------------------
def prune_targets(model, heads: bool = False, embeddings: bool = False) -> dict[str, torch.Tensor]:
    """The weight matrices magnitude pruning reads: every Linear's weight inside the Transformer stacks; with
    ``heads`` also the output heads' (LM / task / MLM head, pooler), with ``embeddings`` the embedding tables. Tied
    tensors appear once (under their first name)."""
    found: dict[str, torch.Tensor] = {}
    seen: set[int] = set()
    for name, module in model.named_modules():
        weight = getattr(module, "weight", None)
        if weight is None or weight.dim() != 2 or id(weight) in seen:
            continue
        is_embedding = isinstance(module, nn.Embedding)
        is_head = isinstance(module, nn.Linear) and HEAD_MODULES.search(name) is not None
        in_stack = isinstance(module, nn.Linear) and ".layers." in f".{name}"
        if (in_stack and not is_head) or (heads and is_head) or (embeddings and is_embedding):
            found[name] = weight
            seen.add(id(weight))
    return found


def _threshold(values: torch.Tensor, sparsity: float) -> float:
    """The magnitude at or below which ``sparsity`` of ``values`` lies; -1 (nothing) for sparsity 0."""
    k = int(round(sparsity * values.numel()))
    return -1.0 if k == 0 else float(values.abs().flatten().kthvalue(k).values)


def magnitude_prune(model, sparsity: float, per_layer: bool = False, heads: bool = False, embeddings: bool = False):
    """(new model, achieved sparsity per matrix name plus "total") with the ``sparsity`` smallest-magnitude weights
    zeroed: ranked over all targeted matrices together (global), or within each matrix (``per_layer``). Global
    pruning lets some matrices lose more than others; biases and norms are never pruned. Shapes are unchanged."""
    _check_fraction("sparsity", sparsity)
    _check_arch(model, "magnitude pruning")
    pruned = copy.deepcopy(model)
    targets = prune_targets(pruned, heads, embeddings)
    with torch.no_grad():
        if not per_layer:
            cut = _threshold(torch.cat([w.detach().abs().flatten().float() for w in targets.values()]), sparsity)
        achieved, zeros, total = {}, 0, 0
        for name, weight in targets.items():
            own = _threshold(weight.detach().float(), sparsity) if per_layer else cut
            weight.masked_fill_(weight.abs() <= own, 0.0)
            n_zero = int((weight == 0).sum())
            achieved[name] = n_zero / weight.numel()
            zeros, total = zeros + n_zero, total + weight.numel()
    achieved["total"] = zeros / max(total, 1)
    return pruned, achieved


# Structured: importance -------------------------------------------------------------------------------------------
def _attentions(model):
    """(path, MultiHeadAttention) of every self- and cross-attention in the stacks."""
    return [(name, m) for name, m in model.named_modules() if isinstance(m, MultiHeadAttention)]


def _feedforwards(model):
    return [(name, m) for name, m in model.named_modules() if isinstance(m, FeedForward)]


def _rows(weight: torch.Tensor, groups: int) -> torch.Tensor:
    """The L2 norm of each of ``groups`` equal blocks of rows: (groups,)."""
    return weight.detach().float().reshape(groups, -1).norm(dim=1)


def weight_importance(model) -> dict[str, torch.Tensor]:
    """Per attention module, (H,): ||o_proj's input columns of head h|| x ||head h's q, k and v rows||; per FFN,
    (d_ff,): ||up row i|| (x ||gate row i|| when gated) x ||down column i||. A head or neuron whose weights are small
    contributes little to the residual stream."""
    out = {}
    for name, attn in _attentions(model):
        h, kv, d = attn.n_heads, attn.n_kv_heads, attn.head_dim
        per_kv = h // kv
        qkv = torch.stack([_rows(attn.q_proj.weight, h) ** 2,
                           _rows(attn.k_proj.weight, kv).repeat_interleave(per_kv) ** 2,
                           _rows(attn.v_proj.weight, kv).repeat_interleave(per_kv) ** 2]).sum(0).sqrt()
        out[name] = _rows(attn.o_proj.weight.t(), h) * qkv
    for name, mlp in _feedforwards(model):
        score = _rows(mlp.up.weight, mlp.up.weight.shape[0]) * _rows(mlp.down.weight.t(), mlp.down.weight.shape[1])
        if mlp.gate is not None:
            score = score * _rows(mlp.gate.weight, mlp.gate.weight.shape[0])
        out[name] = score
    return out


def gradient_importance(model, batches) -> dict[str, torch.Tensor]:
    """Michel et al. 2019's head importance, E_x |dL/d xi_h| with a gate xi_h = 1 on head h's output, and the same
    for each FFN neuron: per attention module (H,) and FFN (d_ff,), averaged over the rows of ``batches``
    (tformer.model.Batch, the runner's training loss). dL/d xi is the sum over positions and the head's features of
    (head output x its gradient), read off o_proj's and down's inputs; no parameter gradient is touched."""
    model_was_training = model.training
    model.eval()
    runner = runner_for(model)
    modules = {name: (a.o_proj, a.n_heads) for name, a in _attentions(model)}
    modules.update({name: (m.down, m.down.weight.shape[1]) for name, m in _feedforwards(model)})
    totals = {name: torch.zeros(groups) for name, (_, groups) in modules.items()}
    rows = 0
    for batch in batches:
        seen: dict[str, torch.Tensor] = {}
        hooks = [linear.register_forward_pre_hook(lambda _m, args, name=name: seen.__setitem__(name, args[0]))
                 for name, (linear, _) in modules.items()]
        try:
            with torch.enable_grad():
                loss = runner.loss(batch.to(runner.device))
                names = list(seen)
                grads = torch.autograd.grad(loss, [seen[n] for n in names], allow_unused=True)
        finally:
            for hook in hooks:
                hook.remove()
        for name, x, g in zip(names, (seen[n] for n in names), grads):
            if g is None:
                continue
            groups = modules[name][1]
            per_row = (x * g).detach().float().reshape(x.shape[0], -1, groups, x.shape[-1] // groups).sum((1, 3))
            totals[name] += per_row.abs().sum(0).cpu()
        rows += int(batch.targets.shape[0])
    model.train(model_was_training)
    return {name: t / max(rows, 1) for name, t in totals.items()}


def importance(model, method: str = "weight", batches=None) -> dict[str, torch.Tensor]:
    """Head and neuron importance by ``method``: "weight" (norms, no data) or "gradient" (needs ``batches``)."""
    if method not in IMPORTANCE:
        raise TformerError(f"importance '{method}' is unknown; choose one of: {', '.join(IMPORTANCE)}")
    if method == "gradient":
        if not batches:
            raise TformerError("gradient importance needs a few batches of data to score heads on")
        return gradient_importance(model, batches)
    return weight_importance(model)


# Structured: removal ----------------------------------------------------------------------------------------------
def _keep(scores: torch.Tensor, drop: int) -> torch.Tensor:
    """Indices of the len(scores) - drop most important, in their original order."""
    return scores.argsort(descending=True)[: scores.numel() - drop].sort().values


def _head_rows(heads: torch.Tensor, dim: int) -> torch.Tensor:
    return (heads[:, None] * dim + torch.arange(dim)).flatten()


def _check_structured(model, heads: int, ffn: float) -> None:
    _check_arch(model, "structured pruning")
    config = model.config
    if not isinstance(heads, int) or heads < 0:
        raise TformerError(f"heads to remove per layer must be a whole number of at least 0, got {heads!r}")
    _check_fraction("the FFN fraction to remove", ffn)
    per_kv = config.n_heads // config.n_kv_heads
    if heads >= config.n_heads:
        raise TformerError(f"removing {heads} of {config.n_heads} heads per layer leaves none; remove at most "
                           f"{config.n_heads - per_kv}")
    if not heads:
        return
    if heads % per_kv:
        raise TformerError(f"this model groups {per_kv} query heads per key/value head (grouped-query attention); "
                           f"remove whole groups: a multiple of {per_kv} heads")
    if config.position == "alibi" or config.position == "relative":
        raise TformerError(f"position='{config.position}' keeps one bias per head for every layer; removing "
                           "different heads per layer would break it: prune FFN neurons only")
    if not all(a.exact for _, a in _attentions(model)):  # their projections / random draws are made per head count
        raise TformerError(f"attention kind '{config.attn_impl}' is sparse or approximate; prune heads of the model "
                           "built with an exact kind (tformer.model.with_attention(model, 'sdpa'))")


def prune_structured(model, heads: int = 0, ffn: float = 0.0, method: str = "weight", batches=None,
                     scores: dict[str, torch.Tensor] | None = None):
    """A new, smaller model: ``heads`` attention heads removed from every attention module (self and cross), and
    ``ffn`` of every FFN's d_ff neurons (rounded down), each layer dropping its own least important by ``method``
    (or the given ``scores``, as ``importance`` returns). Grouped-query attention loses whole key/value groups (heads
    must be a multiple of the group size). The new config keeps head_dim explicit, so d_model is unchanged."""
    _check_structured(model, heads, ffn)
    config = model.config
    drop_neurons = int(ffn * config.d_ff)
    if scores is None:
        scores = importance(model, method, batches) if heads or drop_neurons else {}
    per_kv = config.n_heads // config.n_kv_heads
    state = {k: v.clone() for k, v in model.state_dict().items()}
    for name, attn in _attentions(model) if heads else ():
        group_scores = scores[name].reshape(-1, per_kv).sum(1)  # MHA: one head per group
        kept_kv = _keep(group_scores, heads // per_kv)
        kept = _head_rows(kept_kv, per_kv) if per_kv > 1 else kept_kv
        q_rows, kv_rows = _head_rows(kept, attn.head_dim), _head_rows(kept_kv, attn.head_dim)
        for proj, index in (("q_proj", q_rows), ("k_proj", kv_rows), ("v_proj", kv_rows)):
            for part in ("weight", "bias"):
                key = f"{name}.{proj}.{part}"
                if key in state:
                    state[key] = state[key][index]
        state[f"{name}.o_proj.weight"] = state[f"{name}.o_proj.weight"][:, q_rows]
    for name, mlp in _feedforwards(model) if drop_neurons else ():
        kept = _keep(scores[name], drop_neurons)
        for key in (f"{name}.up.weight", f"{name}.up.bias", f"{name}.gate.weight", f"{name}.gate.bias"):
            if key in state:
                state[key] = state[key][kept]
        state[f"{name}.down.weight"] = state[f"{name}.down.weight"][:, kept]
    # Grouped-query: the groups left; multi-head attention: None, derived again (= the new n_heads).
    changes = {"head_dim": config.head_dim, "d_ff": config.d_ff - drop_neurons, "n_heads": config.n_heads - heads,
               "n_kv_heads": config.n_kv_heads - heads // per_kv if per_kv > 1 else None}
    first = next(model.parameters())
    pruned = build(config.replace(**changes), device=first.device, dtype=first.dtype, init=False)
    pruned.load_state_dict(state)
    return pruned.train(model.training)
