"""peft's adapter folders (adapter_config.json + adapter_model.safetensors), both ways, for a tformer model.

LoRA: keys ``base_model.model.<HF module path>.lora_A.weight`` / ``.lora_B.weight``; the task head under its HF name
(``base_model.model.classifier.weight``, GPT-2's ``score``; peft's modules_to_save). Module paths map to Hugging
Face's through the weight tables of tformer.interop.hf, so a folder written here loads with
``PeftModel.from_pretrained(hf_model, folder)`` and one peft wrote loads here. A Conv1D base (GPT-2) keeps A (r, in)
and B (out, r) as a Linear base does (peft's fan_in_fan_out only transposes the base weight). GPT-2's q, k and v
are one fused c_attn in HF, and a LoRA on c_attn shares one A across all three: separate q/k/v LoRAs have no
peft counterpart, so those targets are refused in this format (o_proj, up and down map to c_proj, c_fc, c_proj).

Prompt and prefix tuning: PROMPT_TUNING / PREFIX_TUNING (no projection), ``prompt_embeddings`` plus the head
(``base_model.classifier.weight``). Methods peft has no format for (adapter, bitfit, head, full) are written in the
same two files with peft_type "TFORMER": the trainable tensors under tformer's names and the PeftSpec; so is any
method on a model with no Hugging Face counterpart (hf_family refuses it), which peft could not load anyway.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

import torch
from safetensors.torch import load_file, save_file
from torch import nn

from tformer.adapt.lora import lora_modules
from tformer.adapt.peft import apply_peft
from tformer.adapt.prompts import PREFIX_NAME, PROMPT_NAME
from tformer.core.atomic import atomic_files
from tformer.core.errors import TformerError
from tformer.core.files import read_json, read_safetensors_header
from tformer.core.peft import PeftSpec
from tformer.interop.hf import BODY_PREFIX, FAMILIES
from tformer.interop.hf_config import hf_family
from tformer.interop.hf_encoders import ENCODER_FAMILIES
from tformer.model import build

CONFIG, WEIGHTS = "adapter_config.json", "adapter_model.safetensors"
PEFT_TYPES = ("LORA", "PROMPT_TUNING", "PREFIX_TUNING", "TFORMER")
TASK_TYPES = {"sequence-classification": "SEQ_CLS", "token-classification": "TOKEN_CLS",
              "question-answering": "QUESTION_ANS"}
LORA_ROOT, PROMPT_ROOT = "base_model.model.", "base_model."  # where peft puts the model's own names


# Names --------------------------------------------------------------------------------
def _model_type(model: nn.Module) -> str:
    return hf_family(model.config)[0]


def _has_hf_family(model: nn.Module) -> bool:
    """Whether peft could hold this model's adapter: its base must have a Hugging Face counterpart."""
    try:
        _model_type(model)
    except TformerError:
        return False
    return True


def _body_prefix(model: nn.Module, keys=None) -> str:
    """HF's outer prefix ("bert.", "transformer."): a task class has it, a bare base model not; a file's keys decide."""
    model_type = _model_type(model)
    prefix = BODY_PREFIX.get(model_type, "")
    if keys is not None:
        return prefix if prefix and any(k.startswith(prefix) for k in keys) else ""
    c = model.config
    bare = not c.task and model_type in ENCODER_FAMILIES and not c.lm_head
    return "" if bare else prefix


def linear_names(model: nn.Module, prefix: str) -> tuple[dict[str, str], dict[str, str], set[str]]:
    """(our Linear path -> HF module path, fused: our path -> HF fused module, HF paths whose base is a Conv1D)."""
    c = model.config
    rules, _ = FAMILIES[_model_type(model)](c, prefix)
    modules = dict(model.named_modules())
    names, fused, conv = {}, {}, set()
    for rule in rules:
        if not (rule.hf.endswith(".weight") and all(o.endswith(".weight") for o in rule.ours)):
            continue
        hf, ours = rule.hf[: -len(".weight")], [o[: -len(".weight")] for o in rule.ours]
        if not all(isinstance(modules.get(o), nn.Linear) for o in ours):
            continue
        if len(ours) > 1:
            fused.update({o: hf for o in ours})
            continue
        names[ours[0]] = hf
        if rule.kind == "t":
            conv.add(hf)
    if getattr(model, "head", None) is not None:
        names["head"] = _head_name(model)
    return names, fused, conv


def _head_name(model: nn.Module) -> str:
    c = model.config
    if c.task == "question-answering":
        return "qa_outputs"
    return "score" if c.traits.decoder_only else "classifier"


def short_targets(chosen: list[str], every: list[str]) -> list[str]:
    """The shortest path endings that pick exactly ``chosen`` out of ``every`` (peft's target_modules matching)."""
    def hits(suffix: str) -> set[str]:
        return {p for p in every if p == suffix or p.endswith("." + suffix)}

    out: list[str] = []
    for path in chosen:
        parts = path.split(".")
        for n in range(1, len(parts) + 1):
            suffix = ".".join(parts[-n:])
            if hits(suffix) <= set(chosen):
                break
        if suffix not in out:
            out.append(suffix)
    return out


# Saving -------------------------------------------------------------------------------
def save_adapter(model: nn.Module, spec: PeftSpec, out_dir) -> Path:
    """Write ``model``'s fine-tuned part in peft's format (see the module docstring); returns the folder."""
    c = model.config
    base = {"base_model_name_or_path": c.name or None, "inference_mode": True, "revision": None,
            "task_type": TASK_TYPES.get(c.task, "CAUSAL_LM" if c.traits.decoder_only else "FEATURE_EXTRACTION")}
    if spec.method == "lora" and _has_hf_family(model):
        config, tensors = _lora_files(model, spec)
    elif spec.method in ("prompt", "prefix") and _has_hf_family(model):
        config, tensors = _prompt_files(model, spec)
    else:
        config = {"peft_type": "TFORMER", "tformer_spec": spec.to_dict()}
        tensors = {n: p for n, p in model.named_parameters() if p.requires_grad}
    tensors = {k: v.detach().to("cpu").contiguous().clone() for k, v in tensors.items()}
    with atomic_files(Path(out_dir), (WEIGHTS, CONFIG)) as stage:
        save_file(tensors, str(stage / WEIGHTS), metadata={"format": "pt"})
        (stage / CONFIG).write_text(json.dumps({**base, **config}, indent=2, sort_keys=True) + "\n")
    return Path(out_dir)


def _head_tensors(model: nn.Module, root: str) -> tuple[dict[str, torch.Tensor], list[str] | None]:
    if getattr(model, "head", None) is None:
        return {}, None
    name = _head_name(model)
    return {f"{root}{name}.{k}": v for k, v in model.head.state_dict().items()}, [name]


def _lora_files(model: nn.Module, spec: PeftSpec):
    loras = lora_modules(model)
    if not loras:
        raise TformerError("the model has no LoRA modules to save; apply_peft(model, PeftSpec('lora', ...)) first")
    names, fused, conv = linear_names(model, _body_prefix(model))
    tensors = {}
    for path, m in loras.items():
        if path in fused:
            raise TformerError(f"LoRA on '{path}' has no peft counterpart: Hugging Face fuses q, k and v into "
                               f"{fused[path]}; target o_proj, up or down for a peft adapter of this model")
        if m.merged:
            raise TformerError("the LoRA weights are merged into the base; unmerge_peft(model) before saving")
        hf = names[path]
        tensors[f"{LORA_ROOT}{hf}.lora_A.weight"] = m.lora_A.weight
        tensors[f"{LORA_ROOT}{hf}.lora_B.weight"] = m.lora_B.weight
    head, to_save = _head_tensors(model, LORA_ROOT)
    tensors.update(head)
    chosen = [names[p] for p in loras]
    every = [hf for ours, hf in names.items() if ours != "head"]
    config = {"peft_type": "LORA", "r": spec.rank, "lora_alpha": spec.alpha, "lora_dropout": spec.dropout,
              "target_modules": short_targets(chosen, every), "bias": "none", "modules_to_save": to_save,
              "fan_in_fan_out": any(hf in conv for hf in chosen), "use_rslora": False, "use_dora": False,
              "init_lora_weights": True, "layers_to_transform": None, "layers_pattern": None,
              "rank_pattern": {}, "alpha_pattern": {}}
    return config, tensors


def _prompt_files(model: nn.Module, spec: PeftSpec):
    c = model.config
    module = getattr(model, PROMPT_NAME if spec.method == "prompt" else PREFIX_NAME, None)
    if module is None:
        raise TformerError(f"the model has no {spec.method} tuning to save; apply_peft it first")
    tensors, to_save = _head_tensors(model, PROMPT_ROOT)
    tensors["prompt_embeddings"] = module.embedding.weight
    config = {"peft_type": "PROMPT_TUNING" if spec.method == "prompt" else "PREFIX_TUNING",
              "num_virtual_tokens": spec.virtual_tokens, "token_dim": c.d_model, "num_transformer_submodules": 1,
              "num_attention_heads": c.n_heads, "num_layers": c.n_layers, "modules_to_save": to_save}
    if spec.method == "prompt":
        config.update(prompt_tuning_init="RANDOM", prompt_tuning_init_text=None, tokenizer_name_or_path=None)
    else:
        config.update(encoder_hidden_size=c.d_model, prefix_projection=False)
    return config, tensors


# Loading ------------------------------------------------------------------------------
def load_adapter(model: nn.Module, adapter_dir) -> PeftSpec:
    """Apply the adapter in ``adapter_dir`` (peft's or ours) to ``model`` in place; returns its PeftSpec.
    Every tensor's name and shape is checked against the model before the model is changed."""
    folder = Path(adapter_dir)
    fix = "is this a peft adapter folder (adapter_config.json + adapter_model.safetensors)?"
    if not (folder / CONFIG).is_file() or not (folder / WEIGHTS).is_file():
        raise TformerError(f"{folder} has no {CONFIG} and {WEIGHTS}; {fix}")
    config = read_json(folder / CONFIG, "adapter config", fix=fix)
    kind = config.get("peft_type")
    if kind not in PEFT_TYPES:
        raise TformerError(f"{folder / CONFIG}: peft_type {kind!r} is not supported; tformer loads "
                           f"{', '.join(PEFT_TYPES)}")
    read_safetensors_header(folder / WEIGHTS, "adapter weights", fix="save or download the adapter again")
    try:
        tensors = load_file(str(folder / WEIGHTS), device="cpu")  # safetensors: plain tensors, nothing unpickled
    except Exception as exc:  # safetensors raises its own error types for a damaged file
        raise TformerError(f"cannot read {folder / WEIGHTS}: {str(exc).splitlines()[0] if str(exc) else exc!r}; "
                           "save or download the adapter again") from None
    if kind == "LORA":
        spec, ours = _lora_plan(model, config, tensors)
    elif kind == "TFORMER":
        spec = PeftSpec.from_dict(config.get("tformer_spec") or {})
        ours = {k: (k, v) for k, v in tensors.items()}
    else:
        spec, ours = _prompt_plan(model, config, tensors, kind)
    # The adapted model's shapes, from a copy that holds no memory: a misfit stops the load before the model changes.
    shapes = {n: tuple(p.shape) for n, p in apply_peft(build(model.config, device="meta"), spec).named_parameters()}
    for name, (key, t) in ours.items():
        if name not in shapes:
            raise TformerError(f"adapter tensor {key!r} names no parameter of this model; the adapter in {folder} "
                               "was made for another base model")
        if tuple(t.shape) != shapes[name]:
            raise TformerError(f"adapter tensor {key!r} has shape {tuple(t.shape)} where this model needs "
                               f"{shapes[name]}; the adapter in {folder} was made for another base model")
    apply_peft(model, spec)
    state = dict(model.named_parameters())
    with torch.no_grad():
        for name, (_, t) in ours.items():
            state[name].copy_(t)
    return spec


def _lora_plan(model: nn.Module, config: dict, tensors: dict) -> tuple[PeftSpec, dict]:
    for key in ("use_dora", "use_rslora", "layers_to_transform", "lora_bias", "target_parameters"):
        if config.get(key) not in (False, None, []):
            raise TformerError(f"this LoRA adapter sets {key}={config[key]!r}, which tformer's LoRA does not run; "
                               "use a plain LoRA adapter")
    if config.get("bias", "none") != "none" or config.get("rank_pattern") or config.get("alpha_pattern"):
        raise TformerError("this LoRA adapter trains biases or varies rank per layer; tformer loads bias='none' with "
                           "one r and lora_alpha")
    stripped = {k.removeprefix(LORA_ROOT): v for k, v in tensors.items()}  # peft's keys all start with it
    names, fused, _ = linear_names(model, _body_prefix(model, stripped))
    by_hf = {hf: ours for ours, hf in names.items() if ours != "head"}
    targets = config.get("target_modules")
    chosen = _hf_matches(by_hf, targets, fused)
    spec = PeftSpec("lora", rank=int(config.get("r", 8)), alpha=float(config.get("lora_alpha", 8)),
                    dropout=float(config.get("lora_dropout", 0.0)),
                    targets=tuple(short_targets([by_hf[hf] for hf in chosen], list(names))))
    ours = {}
    for key, t in stripped.items():
        module, _, leaf = key.rpartition(".")
        owner, _, part = module.rpartition(".")
        if part in ("lora_A", "lora_B") and owner in by_hf:
            ours[f"{by_hf[owner]}.{part}.{leaf}"] = (LORA_ROOT + key, t)
        elif module == names.get("head"):
            ours[f"head.{leaf}"] = (LORA_ROOT + key, t)
        else:
            raise TformerError(f"adapter tensor {LORA_ROOT + key!r} names no module of this {_model_type(model)} "
                               "model; the adapter was made for another base model")
    return spec, ours


def _hf_matches(by_hf: dict[str, str], targets, fused: dict[str, str]) -> list[str]:
    every = list(by_hf)
    if isinstance(targets, str):
        found = [p for p in every if re.fullmatch(targets, p)]
    elif isinstance(targets, list) and targets:
        found = [p for p in every if any(p == t or p.endswith("." + t) for t in targets)]
    else:
        raise TformerError(f"the adapter's target_modules {targets!r} names no modules; the adapter config is damaged")
    fused_hit = sorted({hf for hf in fused.values() if isinstance(targets, list)
                        and any(hf == t or hf.endswith("." + t) for t in targets)})
    if fused_hit:
        raise TformerError(f"the adapter puts LoRA on the fused {fused_hit[0]}, which tformer keeps as separate "
                           "q, k and v projections; use an adapter on c_proj / c_fc")
    if not found:
        raise TformerError(f"the adapter's target_modules {targets!r} match no linear layer of this model; the "
                           "adapter was made for another base model")
    return found


def _prompt_plan(model: nn.Module, config: dict, tensors: dict, kind: str) -> tuple[PeftSpec, dict]:
    if config.get("prefix_projection"):
        raise TformerError("this prefix adapter has a projection MLP (prefix_projection=true), which tformer does not "
                           "run; use prefix_projection=false")
    method = "prompt" if kind == "PROMPT_TUNING" else "prefix"
    spec = PeftSpec(method, virtual_tokens=int(config.get("num_virtual_tokens", 0) or 0))
    name = PROMPT_NAME if method == "prompt" else PREFIX_NAME
    head = _head_name(model) if getattr(model, "head", None) is not None else None
    ours = {}
    for key, t in tensors.items():
        if key == "prompt_embeddings":
            ours[f"{name}.embedding.weight"] = (key, t)
        elif head is not None and key.removeprefix(PROMPT_ROOT).rpartition(".")[0] == head:
            ours[f"head.{key.rpartition('.')[2]}"] = (key, t)
        else:
            raise TformerError(f"adapter tensor {key!r} names no module of this model; the adapter was made for "
                               "another base model")
    return spec, ours


__all__ = ["CONFIG", "PEFT_TYPES", "WEIGHTS", "linear_names", "load_adapter", "save_adapter", "short_targets"]
