"""Weight-only quantization of a trained model (tformer.model.quantized), and PyTorch's dynamic int8 baseline.

``quantize_model`` builds the quantized model from ``config.replace(quantize=...)``, so the model, the ledger
(tformer.cost.quantized) and a saved checkpoint (config.json + model.safetensors: int8 / packed uint8 weights,
float scales) all read one config. Every other tensor (embeddings, norms, biases, heads that stay float) is
copied; the float model is never changed.
"""

from __future__ import annotations

import copy
import warnings

import torch
from torch import nn

from tformer.core.config import QUANTIZATIONS
from tformer.core.errors import TformerError
from tformer.model import build
from tformer.model.quantized import QuantizedLinear

TARGETS = tuple(q for q in QUANTIZATIONS if q not in ("none", "mixed"))  # mixed: read from GGUF files


def quantize_model(model, to: str, group: int | None = None, layers: list[str] | None = None,
                   head: str | None = None):
    """A new model: ``model`` with every Linear of its layers and its LM head quantized to ``to`` ("int8" |
    "int4" | a GGUF block format; ``group``: int4's inputs per scale and zero, default 32). ``to="mixed"`` gives
    each layer's Linears their own formats as a GGUF Q4_K_M file does: ``layers``, one "role:format,..." entry per
    layer (tformer.core.quant_formats), and ``head`` the LM head's (default float). On the model's device, in eval
    mode."""
    config = model.config
    if config.quantize != "none":
        raise TformerError(f"this model is already quantized ({config.quantize}); quantize its float checkpoint "
                           "instead (quantizing twice compounds the rounding)")
    if to not in TARGETS + ("mixed",):
        raise TformerError(f"cannot quantize to {to!r}; choose one of: {', '.join(TARGETS)}")
    if (to == "mixed") != (layers is not None):
        raise TformerError("quantizing to 'mixed' takes each layer's formats (layers), and only it does")
    if group is not None and to != "int4":
        raise TformerError(f"--group sizes int4's groups; {to} keeps one scale per output row: drop --group")
    new_config = config.replace(quantize=to, quant_group=group if to == "int4" else None, quantize_layers=layers,
                                quantize_head=head if to == "mixed" else None)
    first = next(model.parameters())
    new = build(new_config, device=first.device, init=False)
    old_modules = dict(model.named_modules())
    quantized, replaced = set(), set()  # the new model's quantized tensors; the float weights they replace
    with torch.no_grad():
        for name, module in new.named_modules():
            if isinstance(module, QuantizedLinear):
                source = old_modules[name]  # a tied head's weight is the token table: it is quantized as its own
                module.quantize_(source.weight)
                replaced.add(f"{name}.weight")  # a raw-block Linear keeps "blocks", no "weight"
                quantized.update(f"{name}.{t}" for t, _ in module.named_buffers(recurse=False))
                if module.bias is not None:
                    module.bias.copy_(source.bias)
                    quantized.add(f"{name}.bias")
        rest = {k: v for k, v in model.state_dict().items() if k not in quantized and k not in replaced}
        if getattr(new, "tok_embed", None) is None:  # the token table is now read from the head's blocks (or none)
            rest.pop("tok_embed.weight", None)
        missing, unexpected = new.load_state_dict(rest, strict=False)
    missing = [k for k in missing if k not in quantized]
    if missing or unexpected:
        raise TformerError(f"quantizing left tensors unmatched ({sorted(missing or unexpected)[:3]}); the model does "
                           "not match its config")
    return new.eval()


def dynamic_int8(model) -> nn.Module:
    """PyTorch's dynamic int8 quantization of every nn.Linear (torch.ao.quantization.quantize_dynamic: int8
    weights per tensor, activations quantized per call): the baseline the weight-only kernels are measured
    against. A copy; ``model`` is untouched. CPU only (fbgemm / qnnpack)."""
    if model.config.quantize != "none":
        raise TformerError(f"this model is already quantized ({model.config.quantize}); start from the float model")
    from torch.ao.quantization import quantize_dynamic  # deferred: importing it warns that it is deprecated
    clone = copy.deepcopy(model)  # tied tensors stay tied within the copy
    # quantize_dynamic swaps modules of exactly type nn.Linear; tformer's Linear (a subclass) becomes one first.
    for parent in list(clone.modules()):
        for name, child in list(parent.named_children()):
            if isinstance(child, nn.Linear) and type(child) is not nn.Linear:
                plain = nn.Linear(child.in_features, child.out_features, bias=child.bias is not None,
                                  device=child.weight.device)
                plain.weight, plain.bias = child.weight, child.bias
                setattr(parent, name, plain)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # torch.ao.quantization's deprecation notices
        return quantize_dynamic(clone, {nn.Linear}, dtype=torch.qint8, inplace=True).eval()


__all__ = ["TARGETS", "dynamic_int8", "quantize_model"]
