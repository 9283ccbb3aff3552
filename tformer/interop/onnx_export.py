"""A tformer model as an ONNX graph with dynamic batch and sequence axes, checked against ONNX Runtime.

    export_onnx(model, "out/")   ->  out/model.onnx (+ model.onnx.data past 2 GB) and out/onnx.json

The graph is traced by torch.onnx.export's dynamo exporter (torch.export, then onnxscript's translation):
on this torch it keeps the batch and sequence lengths symbolic, where the TorchScript tracer bakes the
sample's shapes into position and mask arithmetic (a GPT-2 traced at 2 x 9 is 0.26 off at 3 x 13).
Data-dependent Python branches in the model (the token-range check, the mask's all-real and dead-row
shortcuts) are skipped while tracing (tformer.model.masks.tracing), so the graph always applies the mask.

What each architecture's graph reads and returns (names as Hugging Face's ORT exports use them):
    decoder          input_ids, attention_mask (B, T)                      -> logits
    encoder          input_ids, attention_mask[, token_type_ids] (B, T)  -> last_hidden_state[, pooler_output][, logits]
    encoder-decoder  input_ids, attention_mask (B, S), decoder_input_ids (B, T) -> logits
    vit              pixel_values (B, C, H, W), H and W fixed              -> last_hidden_state[, logits]
A task head's outputs replace the LM / MLM logits: logits (classification), start_logits + end_logits (answers).
"""

from __future__ import annotations

import contextlib
import io
import json
import logging
import time
import warnings
from dataclasses import asdict, dataclass, field
from pathlib import Path

import numpy as np
import torch
from torch import nn

from tformer.core.atomic import atomic_files
from tformer.core.errors import TformerError

MODEL_FILE = "model.onnx"
DATA_FILE = "model.onnx.data"  # the weights beside the graph, for a model past protobuf's 2 GB limit
META_FILE = "onnx.json"
EXTERNAL_DATA_BYTES = 2**31 - 2**27  # weights above this leave room for nothing else in one protobuf
ARCHS = ("decoder", "encoder", "encoder-decoder", "vit")
# Attention kinds whose graph exports and matches eager within 1e-4 at other shapes than the traced one. The
# tiled, chunked, sliding and sparse kinds size their blocks in Python, so the traced graph keeps the sample's
# length (ORT refuses another) or fails to trace (bigbird).
EXPORTABLE_ATTENTION = ("sdpa", "reference")
EXPORT_SHAPE = (2, 8)  # batch, sequence of the traced sample
CHECK_SHAPE = (3, 11)  # ... and of the check: other lengths, so the check proves the axes are dynamic


@dataclass
class OnnxExport:
    """What export_onnx wrote: the files, the graph's names and axes, and how it was checked."""

    path: Path
    inputs: dict[str, list[str]]  # name -> axis names ("batch", "sequence", or a fixed size as text)
    outputs: dict[str, list[str]]
    exporter: str = "torch.onnx.export(dynamo=True)"
    opset: int | None = None
    seconds: float = 0.0  # export time, the check excluded
    bytes: int = 0  # model.onnx and its data file together
    max_difference: float | None = None  # ONNX Runtime vs PyTorch eager on CHECK_SHAPE inputs
    files: list[str] = field(default_factory=list)
    checked_on: dict[str, list[int]] = field(default_factory=dict)  # the check's input shapes


def check_exportable(config) -> None:
    """One-line TformerError for a config this exporter cannot write."""
    if config.arch not in ARCHS:
        raise TformerError(f"ONNX export supports {', '.join(ARCHS)} models, not arch '{config.arch}'; "
                           "export a Transformer (the recurrent and CLIP models have no ONNX path yet)")
    if config.attn_impl not in EXPORTABLE_ATTENTION:
        raise TformerError(f"attention kind '{config.attn_impl}' does not export to ONNX; rebuild with "
                           f"attn_impl={EXPORTABLE_ATTENTION[0]} (exportable: {', '.join(EXPORTABLE_ATTENTION)})")
    if config.rope_scaling == "dynamic":
        raise TformerError("rope_scaling=dynamic picks its scale from the input's values, which a graph cannot trace; "
                           "export with rope_scaling=linear or none")


def _has_segments(model) -> bool:
    return getattr(model, "type_embed", None) is not None and model.type_embed.num_embeddings > 1


def signature(model) -> tuple[dict[str, list[str]], dict[str, list[str]]]:
    """(inputs, outputs): each graph name -> its axis names, in the graph's order."""
    c = model.config
    seq = ["batch", "sequence"]
    if c.traits.vision_only:
        image = [str(c.num_channels), str(c.image_size), str(c.image_size)]
        outputs = {"last_hidden_state": ["batch", str((c.image_size // c.patch_size) ** 2 + 1), str(c.d_model)]}
        if model.head is not None:
            outputs["logits"] = ["batch", str(c.n_classes)]
        return {"pixel_values": ["batch", *image]}, outputs
    if c.traits.seq2seq:
        inputs = {"input_ids": ["batch", "source_sequence"], "attention_mask": ["batch", "source_sequence"],
                  "decoder_input_ids": ["batch", "sequence"]}
        return inputs, {"logits": [*seq, str(c.vocab_size)]}
    inputs = {"input_ids": seq, "attention_mask": seq}
    if _has_segments(model):
        inputs["token_type_ids"] = seq
    outputs = {"last_hidden_state": [*seq, str(c.d_model)]} if c.traits.text_encoder else {}
    if c.traits.text_encoder and model.pooler is not None:
        outputs["pooler_output"] = ["batch", str(c.d_model)]
    if c.task == "question-answering":
        outputs.update(start_logits=seq, end_logits=seq)
    elif c.task == "token-classification":
        outputs["logits"] = [*seq, str(c.n_classes)]
    elif c.task:
        outputs["logits"] = ["batch", str(c.n_classes)]
    elif c.traits.decoder_only or model.mlm_head is not None:
        outputs["logits"] = [*seq, str(c.vocab_size)]
    return inputs, outputs


class _Graph(nn.Module):
    """The model with positional tensor inputs and a tuple of tensor outputs: what the exporter traces."""

    def __init__(self, model, inputs: list[str], outputs: list[str]):
        super().__init__()
        self.model, self.inputs, self.outputs = model, inputs, outputs

    def forward(self, *tensors):
        out = self.model(**dict(zip(self.inputs, tensors)))
        return tuple(out[name] for name in self.outputs)


def sample_inputs(model, batch: int, length: int, seed: int = 0) -> dict[str, torch.Tensor]:
    """Random inputs for the graph: ids in the vocabulary, later rows right-padded (mask 0) by a growing amount."""
    c = model.config
    g = torch.Generator().manual_seed(seed)
    if c.traits.vision_only:
        return {"pixel_values": torch.randn(batch, c.num_channels, c.image_size, c.image_size, generator=g)}
    length = min(length, _max_length(model))
    ids = torch.randint(0, c.vocab_size, (batch, length), generator=g)
    mask = torch.ones(batch, length, dtype=torch.long)
    for row in range(1, batch):
        mask[row, max(1, length - 2 * row):] = 0
    inputs = {"input_ids": ids, "attention_mask": mask}
    if c.traits.seq2seq:
        inputs["decoder_input_ids"] = torch.randint(0, c.vocab_size, (batch, max(1, length - 3)), generator=g)
    elif _has_segments(model):
        inputs["token_type_ids"] = (torch.arange(length) >= length // 2).long().expand(batch, length).contiguous()
    return inputs


def _max_length(model) -> int:
    """The longest sequence the model takes (learned tables are finite; others: the config's context)."""
    stacks = [s for s in (getattr(model, "encoder", None), getattr(model, "decoder", None)) if s is not None]
    return min(s.max_positions for s in stacks)


def _dynamic_shapes(model, inputs: dict[str, list[str]]):
    dims = {}
    longest = _max_length(model) if not model.config.traits.vision_only else None
    for axes in inputs.values():
        for axis in axes:
            if axis in ("batch", "sequence", "source_sequence") and axis not in dims:
                dims[axis] = torch.export.Dim(axis, min=1, max=longest if axis != "batch" else None)
    return tuple({i: dims[a] for i, a in enumerate(axes) if a in dims} for axes in inputs.values())


def _trace(model, inputs: dict[str, list[str]], outputs: dict[str, list[str]], sample: dict[str, torch.Tensor],
           opset: int | None):
    names = list(inputs), list(outputs)
    graph = _Graph(model, *names).eval()
    dynamic = _dynamic_shapes(model, inputs)
    # The exporter's progress lines, deprecation notes and "torchvision is not installed" log lines are not the
    # user's business: the caller prints one line of its own.
    quiet = logging.getLogger("torch.onnx")
    level = quiet.level
    with warnings.catch_warnings(), torch.no_grad(), contextlib.redirect_stdout(io.StringIO()):
        warnings.simplefilter("ignore")
        quiet.setLevel(logging.ERROR)
        try:
            return torch.onnx.export(graph, tuple(sample[n] for n in names[0]), dynamo=True, dynamic_shapes=(dynamic,),
                                     input_names=names[0], output_names=names[1], opset_version=opset,
                                     verbose=False, report=False)
        except TformerError:
            raise
        except Exception as exc:  # a torch.export failure is pages long: keep its summary's first line
            raise TformerError(f"ONNX export of {model.config.name} failed: {_summary(exc)}; "
                               f"export with attn_impl=sdpa, or report the model config") from exc
        finally:
            quiet.setLevel(level)


def _summary(exc: BaseException) -> str:
    lines = [line.strip() for line in str(exc).splitlines() if line.strip()]
    marks = [i for i, line in enumerate(lines) if line.startswith("## Exception summary")]
    line = lines[marks[0] + 1] if marks and marks[0] + 1 < len(lines) else (lines or [type(exc).__name__])[0]
    return line[:300]


def export_onnx(model, out: str | Path, *, opset: int | None = None, check: bool = True) -> OnnxExport:
    """Write ``model`` (a tformer Transformer) as ``out``/model.onnx and ``out``/onnx.json, atomically.

    check: run the written graph in ONNX Runtime on inputs of another batch and length than the traced ones
    (padding included) and record the largest absolute difference from PyTorch (OnnxExport.max_difference).
    """
    check_exportable(model.config)
    was_training = model.training
    model.eval()
    inputs, outputs = signature(model)
    start = time.perf_counter()
    program = _trace(model, inputs, outputs, sample_inputs(model, *EXPORT_SHAPE), opset)
    weight_bytes = sum(p.numel() * p.element_size() for p in model.parameters())
    external = weight_bytes > EXTERNAL_DATA_BYTES
    files = [MODEL_FILE, DATA_FILE] if external else [MODEL_FILE]
    result = OnnxExport(Path(out) / MODEL_FILE, inputs, outputs, opset=_opset(program), files=[*files, META_FILE])
    with atomic_files(out, (*files, META_FILE)) as stage:
        program.save(str(stage / MODEL_FILE), external_data=external)
        result.seconds = time.perf_counter() - start
        result.bytes = sum((stage / f).stat().st_size for f in files)
        if check:
            probe = sample_inputs(model, *CHECK_SHAPE, seed=1)
            result.checked_on = {name: list(t.shape) for name, t in probe.items()}
            result.max_difference = max_difference(model, stage / MODEL_FILE, probe)
        meta = {k: (str(v) if isinstance(v, Path) else v) for k, v in asdict(result).items()}
        meta.update(path=MODEL_FILE, model=model.config.name, arch=model.config.arch, torch=torch.__version__)
        (stage / META_FILE).write_text(json.dumps(meta, indent=2) + "\n")
    model.train(was_training)
    return result


def _opset(program) -> int | None:
    try:
        return int(program.model.opset_imports.get("", 0)) or None
    except (AttributeError, TypeError, ValueError):
        return None


def ort_session(path: str | Path, threads: int | None = None, spin: bool = True):
    """An ONNX Runtime CPU session over ``path``; threads: intra-op threads (None = ORT's default).
    spin=False: ORT's idle threads sleep instead of spinning after a run (else they hold the cores for a while,
    and PyTorch timed next to them runs on none: bench/export.py)."""
    import onnxruntime as ort  # deferred: a heavy runtime needed only where a graph is run

    options = ort.SessionOptions()
    if not spin:
        options.add_session_config_entry("session.intra_op.allow_spinning", "0")
    if threads:
        options.intra_op_num_threads, options.inter_op_num_threads = threads, 1
    return ort.InferenceSession(str(path), options, providers=["CPUExecutionProvider"])


def run_onnx(session, inputs: dict[str, torch.Tensor]) -> dict[str, np.ndarray]:
    """The graph's outputs by name on ``inputs`` (a session from ort_session, or a path to open one)."""
    if isinstance(session, (str, Path)):
        session = ort_session(session)
    names = [o.name for o in session.get_outputs()]
    feed = {i.name: inputs[i.name].numpy() for i in session.get_inputs()}
    return dict(zip(names, session.run(names, feed)))


def max_difference(model, path_or_session, inputs: dict[str, torch.Tensor]) -> float:
    """Largest absolute difference between ONNX Runtime's outputs and the model's own on ``inputs``."""
    try:
        got = run_onnx(path_or_session, inputs)
    except Exception as exc:  # onnxruntime's Fail, InvalidArgument ... subclass Exception directly
        if not type(exc).__module__.startswith("onnxruntime"):
            raise
        shapes = ", ".join(f"{k} {tuple(v.shape)}" for k, v in inputs.items())
        raise TformerError(f"ONNX Runtime cannot run the exported graph on {shapes}: {_summary(exc)}; "
                           "the graph kept a traced shape: export with attn_impl=sdpa") from exc
    with torch.no_grad():
        want = model.eval()(**inputs)
    worst = 0.0
    for name, value in got.items():
        expected = want[name].float().numpy()
        if value.shape != expected.shape:
            raise TformerError(f"ONNX output {name} has shape {value.shape}, PyTorch's {expected.shape}; "
                               "the graph's axes are not dynamic, report the model config")
        worst = max(worst, float(np.abs(value - expected).max()) if value.size else 0.0)
    return worst
