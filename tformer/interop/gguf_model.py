"""A tformer model from a GGUF file (llama.cpp's format): the config from its metadata, the weights under
Hugging Face's names, then through the same conversion ``load_hf`` uses, so one set of key tables serves both
formats. The weights are either dequantized to fp32 (bit-identical to gguf-py's dequantizer) or, for Q8_0, Q4_1,
Q5_0, Q4_K and Q6_K matrices, kept in their blocks and run by tformer's block Linears
(tformer.model.block_quantized, kquant_linear), each matrix in its own format.

    model = load_gguf("smollm2-135m-instruct")          # a packaged name, or a path to a .gguf file: fp32
    model, tokenizer = load_gguf(path, tokenizer=True, weights="keep")   # the file's blocks, widened per product
    model = load_gguf(path, weights="kernel")           # the file's blocks on the block kernel (llama.cpp's arithmetic)

What llama.cpp's converter changed is undone here, as transformers' GGUF loader does: LLaMA-family Q and K
rows were permuted so that llama.cpp can rotate consecutive pairs; tformer rotates the two halves of a head
(as Hugging Face does), so the rows go back. A file without ``output.weight`` ties the head to the embedding.
The config comes from gguf_config, which checks every metadata value before a model is built; the tensor names,
which rows were permuted and how norms are stored come from the family's record (gguf_families).
"""

from __future__ import annotations

import sys
from pathlib import Path

import torch

from tformer.core.errors import TformerError
from tformer.core.quant_formats import layer_entry
from tformer.interop.gguf_config import gguf_name, hf_config_from_gguf, reading_family, resolve_gguf
from tformer.interop.gguf_families import GgufFamily, GgufTensor
from tformer.interop.gguf_file import GGUFFile, open_gguf
from tformer.interop.gguf_quants import KEPT, block_parts, dequantize
from tformer.interop.gguf_tokenizer import tokenizer_from_gguf
from tformer.interop.hf import model_from_hf
from tformer.model import ggml_kernel
from tformer.model.quantized import use_path

# load_gguf's choices: blocks kept and run by the block kernel, kept and widened at each product, all fp32, or auto:
# the kernel where it is built (what a file's other block types hold widened to fp32, with a note), else fp32
WEIGHTS = ("auto", "kernel", "keep", "dequantize")
# The GGUF Linears a layer may keep in blocks (their module names under decoder.layers.{i} are the family's)
_ROLES = {"attn_q": "q", "attn_k": "k", "attn_v": "v", "attn_output": "o", "ffn_gate": "gate", "ffn_up": "up",
          "ffn_down": "down"}  # config.quantize_layers' names for them
_FLOAT_TYPES = ("F32", "F16", "BF16")
# a permuted row's ModelConfig head-count field -> the Hugging Face config key the reader has it under
_HF_HEADS = {"n_heads": "num_attention_heads", "n_kv_heads": "num_key_value_heads"}


def unpermute(w: torch.Tensor, n_head: int) -> torch.Tensor:
    """Q or K rows (n_head x head_dim, in) from llama.cpp's pair order back to Hugging Face's half order.

    llama.cpp's converter grouped each head's rows as (head_dim/2, 2) pairs; this regroups them as
    (2, head_dim/2) halves: the inverse of its reshape(n_head, 2, d/2, in).swapaxes(1, 2)."""
    rows = w.shape[0]
    return w.reshape(n_head, rows // n_head // 2, 2, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape)


def hf_state_from_gguf(f: GGUFFile, hf_config: dict, kept: dict[str, str] | None = None) -> dict[str, torch.Tensor]:
    """Every tensor of the file, dequantized to fp32, under its Hugging Face name; those named in ``kept``
    (GGUF name -> our module) are meta tensors of their shape, for the caller to fill from the blocks."""
    n_layers, family = f.metadata[f"{reading_family(f).name}.block_count"], reading_family(f)  # checked by the config
    sd = {}
    for name, info in f.tensors.items():
        if name == "rope_freqs.weight":  # Llama 3's RoPE scaling, read into the config (gguf_config._llama3_rope)
            continue
        hf, row = _hf_name(f, name, n_layers, family)
        if kept and name in kept:  # token_embd kept is the tied head's, whose blocks the lookup reads too
            sd[hf] = torch.empty(info.shape[::-1] if row.hf_transpose else info.shape, device="meta")
            continue
        w = dequantize(f.raw(name), info.ggml_type, info.shape)
        if row.permute:
            w = unpermute(w, hf_config[_HF_HEADS[row.permute]])
        elif row.hf_transpose:
            w = w.t().contiguous()  # GPT-2's Conv1D holds (in, out)
        elif family.norm_offset and name.endswith("norm.weight"):
            w = w - family.norm_offset  # llama.cpp stores Gemma's scale 1 + w whole; ours (as transformers') holds w
        sd[hf] = w
    return sd


def _hf_name(f: GGUFFile, name: str, n_layers: int, family: GgufFamily) -> tuple[str, GgufTensor]:
    """Hugging Face's name of the file's tensor ``name``, and its row in the family's record."""
    if name in family.hf_model:
        row = family.hf_model[name]
        return row.hf, row
    layer, what = family.hf_layer, family.name
    if name.startswith("blk.") and name.count(".") >= 2:
        index, _, rest = name[4:].partition(".")
        if not index.isdigit() or int(index) >= n_layers or rest not in layer:
            raise TformerError(f"GGUF file {f.path}: tensor {name} is not part of a {what} model with "
                               f"{n_layers} layers; the file is damaged or of another architecture")
        return f"{family.hf_layer_prefix}.{int(index)}.{layer[rest].hf}", layer[rest]
    if name.startswith("rope_factors_"):
        raise TformerError(f"GGUF file {f.path} carries {name} (Phi-3's LongRoPE, the 128k models), which tformer "
                           "does not support yet; the 4k models read")
    raise TformerError(f"GGUF file {f.path}: tensor {name} is not part of a {what} model; the file is "
                       "damaged or of another architecture")


def kept_linears(f: GGUFFile) -> tuple[dict[str, str], dict]:
    """The Linears that stay in their blocks (GGUF name -> our module) and the config fields that say so:
    quantize (one format for every layer's Linears, or "mixed" with quantize_layers giving each its own, as a
    llama.cpp "Q4_K_M" file mixes Q5_0, Q4_K, Q6_K and Q8_0) and quantize_head for the LM head. Float matrices
    stay float; a block type tformer does not keep is refused with the way out. A tensor the file fuses from
    several of tformer's Linears (gpt2's and phi3's attn_qkv, phi3's gate-and-up ffn_up) is widened, not kept."""
    modules = {t.gguf.removesuffix(".weight"): t.ours[0].removesuffix(".weight")
               for t in reading_family(f).layer if t.gguf.removesuffix(".weight") in _ROLES and len(t.ours) == 1}
    layers: dict[str, str] = {}
    formats: dict[int, dict[str, str]] = {}
    for name in f.tensors:
        index, _, rest = name.removeprefix("blk.").partition(".")
        stem = rest.removesuffix(".weight")
        role = _ROLES.get(stem) if rest.endswith(".weight") and stem in modules else None
        if name.startswith("blk.") and index.isdigit() and role:
            layers[name] = f"decoder.layers.{int(index)}.{modules[stem]}"
            formats.setdefault(int(index), {})[role] = _format(f, name, "layers' matrices")
    if not formats:
        raise TformerError(f"GGUF file {f.path}: tformer keeps no {reading_family(f).name} matrices in their blocks "
                           "yet (its fused ones); load it with --gguf-weights dequantize")
    head = "output.weight" if "output.weight" in f.tensors else "token_embd.weight"
    head_format = _format(f, head, "LM head")
    kept = {n: m for n, m in layers.items() if f.tensors[n].ggml_type in KEPT}
    if head_format != "none":
        kept[head] = "lm_head"
    used = {fmt for per_layer in formats.values() for fmt in per_layer.values()}
    if any(t.gguf.endswith(".weight") and len(t.ours) > 1 for t in reading_family(f).layer):
        used.add("none")  # the fused matrices' Linears are float: one format for every Linear would misname them
    fields = {"quantize": next(iter(used)) if len(used) == 1 else "mixed", "quantize_head": head_format}
    if fields["quantize"] == "mixed":
        fields["quantize_layers"] = [layer_entry(formats.get(i, {})) for i in range(max(formats) + 1)]
    return kept, fields


def kept_formats(name_or_path: str | Path) -> dict:
    """The config fields (quantize, quantize_head, quantize_layers) a model loaded with weights="keep" would have:
    the file's own formats, read from its tensor table alone (the ledger's row for the file's blocks)."""
    with open_gguf(resolve_gguf(name_or_path)) as f:
        return {"quantize_layers": None, **kept_linears(f)[1]}


def _format(f: GGUFFile, name: str, what: str) -> str:
    """A matrix's format in config.quantize's words ("none" for a float one), or the refusal."""
    t = f.tensors[name].ggml_type
    if t in _FLOAT_TYPES:
        return "none"
    if t not in KEPT:
        raise TformerError(f"GGUF file {f.path} holds its {what} as {t} ({name}); tformer keeps {', '.join(KEPT)} "
                           "blocks: load it with --gguf-weights dequantize")
    return t.lower()


def _fill_blocks(model, f: GGUFFile, kept: dict[str, str], hf_config: dict) -> None:
    """Each kept Linear's buffers from its tensor's blocks, Q and K rows unpermuted as the fp32 path does."""
    # the family's permuted rows (LLaMA's Q and K; none for Gemma 3) by their GGUF name within a layer
    permuted = {t.gguf: hf_config[_HF_HEADS[t.permute]] for t in reading_family(f).layer if t.permute}
    with torch.no_grad():
        for name, module_name in kept.items():
            info = f.tensors[name]
            parts = block_parts(f.raw(name), info.ggml_type, info.shape)
            n_head = permuted.get(name.split(".", 2)[2]) if name.startswith("blk.") else None
            if n_head:
                parts = tuple(unpermute(p, n_head) for p in parts)
            model.get_submodule(module_name).set_blocks(*parts)


def load_gguf(name_or_path: str | Path, device=None, dtype=None, tokenizer: bool = False,
              weights: str = "dequantize"):
    """Our model from a GGUF file or a packaged model's name; with ``tokenizer=True``, (model, the file's
    tokenizer). ``weights``: "keep" runs Q8_0, Q4_1, Q5_0, Q4_K and Q6_K matrices in their blocks (a tied head's
    blocks serve the token lookup too; float matrices, an untied embedding and the norms in fp32) and refuses other
    block types (each product widens the blocks exactly: the dequantized model's numbers in about a fifth of its
    memory; tformer.model.quantized.use_path(model, "kernel") puts them on torch's bf16 kernel); "kernel" keeps them
    so and runs them on the block kernel (tformer.model.ggml_kernel: activations rounded to 8 bits per block of 32,
    as llama.cpp does); "dequantize" (the default) widens every tensor to fp32 (or ``dtype``); "auto" is "kernel"
    where the kernel is built, keeping what it can and widening the rest (each saying so in one line on stderr),
    else "dequantize". A model on the kernel gives the kernel's pool torch's threads and leaves torch one, for the
    rest of the process (ggml_kernel.take_threads: the two pools spinning side by side halve both)."""
    if weights not in WEIGHTS:
        raise TformerError(f"--gguf-weights {weights} is not a choice; choose one of: {', '.join(WEIGHTS)}")
    if weights in ("kernel", "auto") and not ggml_kernel.available():
        if weights == "kernel" or dtype not in (None, torch.float32):
            raise TformerError(ggml_kernel.unavailable_reason())
        print(f"note: {ggml_kernel.unavailable_reason()}", file=sys.stderr)
        weights = "dequantize"
    if weights == "auto" and dtype not in (None, torch.float32):
        weights = "dequantize"  # the kernel runs fp32 activations; a model asked for in another dtype is widened
    path = resolve_gguf(name_or_path)
    with open_gguf(path) as f:
        hf_config = hf_config_from_gguf(f)
        tok = tokenizer_from_gguf(f.metadata) if tokenizer else None  # before the weights: a bad vocabulary fails fast
        if tok is not None:  # carried as read, so `export --format gguf` writes the tokenizer back unchanged
            tok.metadata = {k: v for k, v in f.metadata.items() if k.startswith("tokenizer.")}
            tok.metadata_types = {k: f.metadata_types[k] for k in tok.metadata}
        kept, fields = {}, None
        if weights in ("keep", "kernel", "auto"):
            try:
                kept, fields = kept_linears(f)
            except TformerError as exc:
                if weights in ("keep", "kernel"):
                    raise
                print(f"note: {exc.args[0].split(';')[0]}; its weights are widened to fp32", file=sys.stderr)
        if kept and dtype not in (None, torch.float32):
            raise TformerError(f"kept blocks carry their own fp16 scales and run on fp32 activations; for dtype "
                               f"{dtype} load with --gguf-weights dequantize")
        sd = hf_state_from_gguf(f, hf_config, kept)
        model = model_from_hf(hf_config, sd, gguf_name(name_or_path, path), device=device, dtype=dtype,
                              quantize=fields if kept else None)
        _fill_blocks(model, f, kept, hf_config)
    if kept and weights in ("kernel", "auto"):
        use_path(model, "blocks")
        ggml_kernel.take_threads()  # the kernel's pool runs the products; torch's own pool would spin against it
    return (model, tok) if tokenizer else model


__all__ = ["WEIGHTS", "hf_state_from_gguf", "kept_formats", "kept_linears", "load_gguf", "unpermute"]
