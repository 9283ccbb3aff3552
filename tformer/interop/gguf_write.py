"""GGUF out: a tformer model and its tokenizer as one file that llama.cpp (and ollama, which runs llama.cpp) loads.

    result = save_gguf(model, "shakespeare.q8_0.gguf", "q8_0", tokenizer)
    print(result.path, result.bytes, result.tensor_types)      # {"F32": 9, "Q8_0": 11}

Four of llama.cpp's architectures hold what tformer trains (a record each in gguf_families: the tensor names, the
metadata, which configs each holds, the most specific match chosen):

- ``llama``: a decoder with RoPE, RMSNorm, a SwiGLU MLP and no biases (LLaMA, SmolLM2, a tformer llama). llama.cpp
  rotates consecutive pairs of a head's dimensions where tformer (as Hugging Face) rotates its two halves, so the
  Q and K rows are written in llama.cpp's pair order: the inverse of ``gguf_model.unpermute``.
- ``qwen2`` (llama's layers with biases on q, k and v: ``qkv_bias``) and ``qwen3`` (with ``qk_norm``): rotated by
  halves in llama.cpp too, so written without the permutation.
- ``gpt2``: a decoder with learned positions and LayerNorm (GPT-2, the course's char-small). llama.cpp holds Q, K
  and V as one fused matrix, and every Linear has a bias (a model trained without them gets zero ones: the same
  sums).

Anything else (an encoder, an RNN, Mistral's sliding window, which llama.cpp's llama has no key for, other
attention kinds, RoPE scaling, ...) is refused in one line before anything is written.

Tensor types (``ggml_type``): f32, f16, q8_0 or q4_1 for the matrices; norms, biases and the learned position
table stay F32 whatever the type, as llama.cpp's own converter and quantizer keep them. q8_0 and q4_1 store
blocks of 32 values along a row, so a matrix whose rows are not a multiple of 32 long is written as F16
instead (as llama.cpp's converter falls back), and the result says which. A tied head is written once: a file
without ``output.weight`` is read as tied. The blocks are tformer's own (``gguf_quants.quantize``, byte for byte
gguf-py's); the file itself is laid out by gguf-py's ``GGUFWriter``, streamed one tensor at a time into a
temporary file beside the target that is renamed into place only once complete and synced.

The tokenizer goes in the file too (llama.cpp cannot run a model without one), as a byte-level BPE vocabulary
(``tokenizer.ggml.model = "gpt2"``):

- from a GGUF file (``GGUFTokenizer``): its ``tokenizer.*`` metadata exactly as read, when the tokenizer carries
  it (``keep_gguf_metadata``); else rebuilt from the tokenizer (tokens, control / user-defined types, merges,
  pre-tokenizer, special ids, add_bos/add_eos, chat template);
- GPT-2's tiktoken ranks (``GPT2Tokenizer``): tokens spelled in GPT-2's byte alphabet, the merges recovered from
  the ranks, pre-tokenizer ``gpt-2``;
- a byte-level BPE ``tokenizer.json`` (``ByteBPETokenizer``, a Hugging Face folder's tokenizer) whose
  pre-tokenizer is GPT-2's: its tokens and merges, pre-tokenizer ``gpt-2``;
- characters (``CharTokenizer``): each character a byte-level token and no merges, which splits text into
  characters exactly as the tokenizer did; only when every character is one byte (ASCII).

A vocabulary smaller than the model's embedding is padded with unused ``[PAD{id}]`` tokens (llama.cpp needs one
token per row); a larger one is refused.
"""

from __future__ import annotations

import contextlib
import warnings
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import torch

from tformer.core.atomic import atomic_path
from tformer.core.attention_kinds import EXACT_KINDS
from tformer.core.errors import TformerError
from tformer.interop.checkpoint import unwrap
from tformer.interop.gguf_families import EXPORTS, HEAD, WRITES, GgufFamily, export_refusal, family_for_config
from tformer.interop.gguf_quants import quantize, quantized_nbytes
from tformer.interop.gguf_vocab import (
    _carried_entries,
    _Entry,
    _tokenizer_entries,
    _vocabulary,
)
from tformer.interop.hf_config import config_to_hf
from tformer.model.position import RopeScaling, llama3_freq_factors

# --type -> the ggml type of the matrices, and llama.cpp's general.file_type (llama_ftype) for a file of them.
TYPES = {"f32": "F32", "f16": "F16", "q8_0": "Q8_0", "q4_1": "Q4_1"}
_FILE_TYPES = {"f32": 0, "f16": 1, "q4_1": 3, "q8_0": 7}  # ALL_F32, MOSTLY_F16, MOSTLY_Q4_1, MOSTLY_Q8_0
_BLOCK = 32  # values per Q8_0 / Q4_1 block
ARCHITECTURES = WRITES  # llama, gpt2
QUANTIZATION_VERSION = 2  # ggml's GGML_QNT_VERSION, which every quantized llama.cpp file names


@dataclass
class GGUFExport:
    """What save_gguf wrote."""

    path: Path
    arch: str  # llama | gpt2
    ggml_type: str  # the --type: f32, f16, q8_0, q4_1
    bytes: int
    tensors: int
    tensor_types: dict[str, int]  # ggml type -> how many tensors are stored in it
    tokenizer: str  # the vocabulary written, in words
    notes: list[str] = field(default_factory=list)  # fallbacks and caveats, one line each


# ---------------------------------------------------------------------------------------------
# Which architecture, or why none


_refuse = export_refusal  # one line: what this config is, then what tformer writes (EXPORTS)


def gguf_architecture(config) -> str:
    """The llama.cpp architecture ``config`` is written as (llama or gpt2), or a one-line TformerError naming
    what no GGUF file tformer writes can hold. The config alone is read: a --preset is checked before it is built."""
    return gguf_export_family(config).name


def gguf_export_family(config) -> GgufFamily:
    """gguf_architecture's family record (gguf_families), or its refusal."""
    if not config.traits.decoder_only:
        raise _refuse(config, f"it is {config.traits.label}")
    if config.task:
        raise _refuse(config, f"it has a {config.task} head in place of the LM head")
    if config.quantize != "none":
        raise _refuse(config, f"its Linears hold {config.quantize} weights; export the float model (a GGUF file read "
                              "with --gguf-weights dequantize, or the model before tformer quantize) and pick the "
                              "GGUF --type instead")
    family = family_for_config(config)
    arch = family.name
    if config.attn_impl == "sliding":
        raise _refuse(config, f"sliding-window attention (window {config.attn_window}: Mistral's) has no key in "
                              f"llama.cpp's {arch} architecture, which would attend to the whole context")
    if config.attn_impl not in EXACT_KINDS:
        raise _refuse(config, f"attention kind '{config.attn_impl}' is not the plain softmax attention llama.cpp "
                              f"computes (exact kinds: {', '.join(EXACT_KINDS)})")
    why = family.refusal(config) if family.refusal else None
    if why:
        raise _refuse(config, why)
    # Every other field (norm placement, a final norm, scaled embeddings, grouped heads on gpt2, ...) against what
    # the Hugging Face family of the same name holds: llama.cpp's families hold the same models.
    # gpt2's biases are written as zeros when the model has none; the exact attention kinds compute the same
    plain = config.replace(attn_impl="sdpa", **({"bias": True} if family.zero_biases else {}))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # dropout rates: a GGUF file is for inference
        try:
            config_to_hf(plain)
        except TformerError as exc:
            reason = str(exc).split(": ", 1)[-1] if str(exc).startswith("this model cannot be saved") else str(exc)
            raise _refuse(config, f"llama.cpp's {arch} cannot hold {reason}") from None
    return family


def check_type(ggml_type: str) -> str:
    """``ggml_type`` (f32, f16, q8_0, q4_1; any case) normalised, or a one-line TformerError."""
    name = str(ggml_type).lower()
    if name not in TYPES:
        raise TformerError(f"--type {ggml_type} is not a GGUF type tformer writes; choose one of: {', '.join(TYPES)}")
    return name


# ---------------------------------------------------------------------------------------------
# Tensors


@dataclass
class _Tensor:
    name: str  # llama.cpp's
    shape: tuple[int, ...]  # PyTorch order
    make: object  # () -> the fp32 tensor
    ggml_type: str


def _permute(w: torch.Tensor, n_head: int) -> torch.Tensor:
    """Q or K rows from Hugging Face's half order to llama.cpp's pair order: the inverse of gguf_model.unpermute
    (each head's rows as two halves of head_dim/2, interleaved into consecutive pairs)."""
    rows = w.shape[0]
    return w.reshape(n_head, 2, rows // n_head // 2, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape)


def _plan(model, config, family: GgufFamily, ggml_type: str) -> tuple[list[_Tensor], list[str]]:
    """The tensors to write, in the family's file order, and notes; every tensor of the model must find a place."""
    state = {k: v.detach() for k, v in model.state_dict().items()}
    used: set[str] = set()

    def take(name: str) -> torch.Tensor:
        used.add(name)
        return state[name]

    def fp32(t: torch.Tensor) -> torch.Tensor:
        return t.to("cpu", torch.float32)

    plan: list[_Tensor] = []
    fallback: list[str] = []

    def add(name: str, make, shape, matrix: bool = True) -> None:
        kind = TYPES[ggml_type] if matrix and len(shape) == 2 else "F32"
        if kind in ("Q8_0", "Q4_1") and shape[-1] % _BLOCK:
            kind = "F16"
            fallback.append(name)
        plan.append(_Tensor(name, tuple(int(s) for s in shape), make, kind))

    def direct(name: str, ours: str, matrix: bool = True) -> None:
        t = take(ours)
        add(name, lambda: fp32(t), t.shape, matrix)

    for name, ours, row in family.expand(config.n_layers, head=False):
        if row.zero_fill:  # a bias, of one Linear or of several fused: zeros where the model was trained without
            rows = [state[o.removesuffix("bias") + "weight"].shape[0] for o in ours]
            add(name, _bias(state, used, [o.removesuffix(".bias") for o in ours], rows), (sum(rows),))
        elif row.permute:  # llama.cpp's pair order, for the heads its RoPE rotates
            t, n_head = take(ours[0]), getattr(config, row.permute)
            add(name, lambda t=t, n=n_head: _permute(fp32(t), n), t.shape)
        elif len(ours) > 1:  # fused along the rows (gpt2's attn_qkv)
            parts = [take(o) for o in ours]
            add(name, lambda parts=parts: torch.cat([fp32(t) for t in parts]),
                (sum(t.shape[0] for t in parts), parts[0].shape[1]))
        else:
            direct(name, ours[0], row.matrix)
    if config.rope_scaling == "llama3":  # Llama 3's RoPE scaling as llama.cpp reads it: each frequency's divisor
        factors = llama3_freq_factors(config.head_dim, config.rope_theta, RopeScaling.from_config(config))
        add("rope_freqs.weight", lambda: factors, factors.shape, matrix=False)
    head = state.get("lm_head.weight")
    if head is not None:
        tied = config.tied_embeddings and (head.data_ptr() == state["tok_embed.weight"].data_ptr()
                                           or torch.equal(head, state["tok_embed.weight"]))
        if tied:
            used.add("lm_head.weight")  # llama.cpp reads a file without output.weight as tied
        else:
            direct(HEAD.gguf, HEAD.ours[0])
    left = [k for k in state if k not in used]
    if left:
        shown = ", ".join(left[:4]) + (f", ... ({len(left) - 4} more)" if len(left) > 4 else "")
        raise _refuse(config, f"llama.cpp's {family.name} has no place for {shown} (a bias where it has none, "
                              "adapter or LoRA weights: merge them first)")
    notes = []
    if fallback:
        shown = ", ".join(fallback[:3]) + (f" and {len(fallback) - 3} more" if len(fallback) > 3 else "")
        notes.append(f"{len(fallback)} matrices have rows that are not a multiple of {_BLOCK} values, which "
                     f"{TYPES[ggml_type]} blocks need; written as F16 instead: {shown}")
    return plan, notes


def _bias(state, used: set[str], modules: list[str], sizes: list[int]):
    """The bias of one or several (fused) Linears; zeros for one trained without (the same sum)."""
    parts = []
    for module, size in zip(modules, sizes):
        name = f"{module}.bias"
        if name in state:
            used.add(name)
            parts.append(state[name])
        else:
            parts.append(torch.zeros(size))
    return lambda: torch.cat([p.to("cpu", torch.float32) for p in parts])


# ---------------------------------------------------------------------------------------------
# Metadata


def _model_metadata(config, family: GgufFamily, ggml_type: str) -> list[_Entry]:
    a = f"{family.name}."
    out = [
        _Entry("general.name", str(config.name), "string"),
        _Entry(a + "vocab_size", config.vocab_size, "u32"),
        _Entry(a + "context_length", config.max_positions, "u32"),
        _Entry(a + "embedding_length", config.d_model, "u32"),
        _Entry(a + "block_count", config.n_layers, "u32"),
        _Entry(a + "feed_forward_length", config.d_ff, "u32"),
        _Entry(a + "attention.head_count", config.n_heads, "u32"),
    ]
    # the family's own keys (head counts, norm epsilon, RoPE), in its order
    out += [_Entry(a + key, value, kind) for key, value, kind in (family.metadata(config) if family.metadata else [])]
    out += [_Entry("general.file_type", _FILE_TYPES[ggml_type], "u32"),
            _Entry("general.quantization_version", QUANTIZATION_VERSION, "u32")]
    return out


def _value_types():
    from gguf import GGUFValueType as T

    return {"u8": T.UINT8, "i8": T.INT8, "u16": T.UINT16, "i16": T.INT16, "u32": T.UINT32, "i32": T.INT32,
            "f32": T.FLOAT32, "bool": T.BOOL, "string": T.STRING, "u64": T.UINT64, "i64": T.INT64, "f64": T.FLOAT64}


def _writer_class():
    from gguf import GGUFValueType, GGUFWriter

    class Writer(GGUFWriter):
        def _pack_val(self, val, vtype, add_vtype, sub_type=None):
            # gguf-py refuses an empty array, which the format holds (a count of 0) and llama.cpp reads: the merges
            # of a character vocabulary, which has none
            if vtype == GGUFValueType.ARRAY and sub_type is not None and len(val) == 0:
                head = self._pack("I", vtype) if add_vtype else b""
                return head + self._pack("I", sub_type) + self._pack("Q", 0)
            return super()._pack_val(val, vtype, add_vtype, sub_type)

    return Writer


def _add(writer, entry: _Entry, types) -> None:
    from gguf import GGUFValueType

    value = entry.value
    if entry.type.startswith("array[") and entry.type.endswith("]"):
        sub = types[entry.type[6:-1]]
        items = value.tolist() if isinstance(value, np.ndarray) else list(value)
        writer.add_key_value(entry.key, items, GGUFValueType.ARRAY, sub_type=sub)
        return
    if isinstance(value, (np.generic,)):
        value = value.item()
    if entry.type not in types:
        raise TformerError(f"GGUF metadata {entry.key}: type {entry.type} is not one tformer writes")
    writer.add_key_value(entry.key, value, types[entry.type])


def _gguf():
    try:
        import gguf
    except ImportError:
        raise TformerError("writing GGUF needs gguf-py (llama.cpp's own reader and writer of the format): "
                           "pip install gguf") from None
    return gguf


def save_gguf(model, path, ggml_type: str = "f32", tokenizer=None) -> GGUFExport:
    """Write ``model`` and ``tokenizer`` as the GGUF file ``path`` (see the module's docstring); returns what was
    written. The model and the tokenizer are checked before the first byte is written; a failure while writing
    (a NaN weight the block types cannot hold, a full disk, a crash) leaves nothing behind either, since the file
    appears under its name only once complete."""
    gguf = _gguf()
    ggml_type = check_type(ggml_type)
    path = Path(path)
    if path.is_dir():
        raise TformerError(f"{path} is a folder; give the .gguf file's path")
    model = unwrap(model)
    config = model.config
    family = gguf_export_family(config)
    arch = family.name
    if tokenizer is None:
        raise TformerError(f"cannot export {config.name} as GGUF without its tokenizer: llama.cpp cannot run a model "
                           "whose file has no vocabulary; export a training run or model that has one")
    n_rows = config.vocab_size
    carried = _carried_entries(tokenizer, n_rows)
    if carried is not None:
        tok_entries, tok_notes = carried, []
        carried_metadata = tokenizer.metadata
        merges = carried_metadata.get("tokenizer.ggml.merges") or []
        described = (f"the GGUF file's tokenizer as read ({len(carried_metadata['tokenizer.ggml.tokens']):,} tokens, "
                     f"{len(merges):,} merges, pre-tokenizer {carried_metadata.get('tokenizer.ggml.pre', 'default')})")
    else:
        vocab = _vocabulary(tokenizer, config)
        tok_entries, tok_notes = _tokenizer_entries(vocab, n_rows)
        described = f"{vocab.source}: {n_rows:,} tokens, {len(vocab.merges):,} merges, pre-tokenizer {vocab.pre}"
    plan, notes = _plan(model, config, family, ggml_type)
    notes = notes + tok_notes + (family.notes(config) if family.notes else [])

    types = _value_types()
    with atomic_path(path) as tmp:
        writer = _writer_class()(tmp, arch)
        try:
            for entry in _model_metadata(config, family, ggml_type) + tok_entries:
                _add(writer, entry, types)
            for t in plan:
                per_block, block_bytes = gguf.GGML_QUANT_SIZES[gguf.GGMLQuantizationType[t.ggml_type]]
                row_bytes = t.shape[-1] // per_block * block_bytes
                writer.add_tensor_info(t.name, (*t.shape[:-1], row_bytes), np.dtype(np.uint8),
                                       quantized_nbytes(t.ggml_type, t.shape),
                                       raw_dtype=gguf.GGMLQuantizationType[t.ggml_type])
            writer.write_header_to_file()
            writer.write_kv_data_to_file()
            writer.write_ti_data_to_file()
            # one tensor in memory at a time, quantized as it is written
            for t in plan:
                writer.write_tensor_data(quantize(t.make(), t.ggml_type))
            writer.flush()
        finally:
            with contextlib.suppress(Exception):
                writer.close()
    return GGUFExport(path=path, arch=arch, ggml_type=ggml_type, bytes=path.stat().st_size, tensors=len(plan),
                      tensor_types=dict(sorted(Counter(t.ggml_type for t in plan).items())), tokenizer=described,
                      notes=notes)


__all__ = ["ARCHITECTURES", "EXPORTS", "TYPES", "GGUFExport", "check_type", "gguf_architecture", "gguf_export_family",
           "save_gguf"]
