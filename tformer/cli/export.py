"""`tformer export`: a model (a run, a Hugging Face folder, a preset) as a Hugging Face folder, an ONNX graph or a
GGUF file (llama.cpp's format).

    tformer export --ckpt runs/shakespeare --out hf/shakespeare
    python -c "import transformers; transformers.AutoModelForCausalLM.from_pretrained('hf/shakespeare')"
    tformer export --format onnx --ckpt runs/shakespeare --out onnx/shakespeare
    tformer export --format onnx --hf all-minilm-l6-v2 --out onnx/minilm
    tformer export --format onnx --preset bert-base --set task=sequence-classification --out onnx/bert

The folder holds config.json + model.safetensors in the layout `transformers` loads for the model's
family (GPT-2, LLaMA, BERT, BART or T5, chosen from the config), written atomically; the run's
tformer tokenizer, if any, is saved beside them (tformer-tokenizer.json and its data files).

--format onnx writes model.onnx (dynamic batch and sequence axes) and onnx.json (its input and output
names and axes: tformer.interop.onnx_export), then runs the graph in ONNX Runtime on inputs of another
shape and prints the largest difference from PyTorch, so every export is checked. The model comes from any
source the other commands read (tformer.cli._source): --ckpt, --hf (a folder or a packaged name), or --preset
(randomly initialised, with --set overrides and --seed).

--format gguf writes one file (--out is its path) that llama.cpp and ollama run: the weights under llama.cpp's
names (architecture llama or gpt2), the matrices as --type f32 (default), f16, q8_0 or q4_1, and the model's
tokenizer as a byte-level BPE vocabulary (tformer.interop.gguf_write). A model from --gguf keeps its file's
tokenizer metadata as read. It prints the file, its size and how many tensors each ggml type holds.

    tformer export --format gguf --type q8_0 --ckpt runs/shakespeare --out shakespeare.q8_0.gguf
    llama-cli -m shakespeare.q8_0.gguf -p "ROMEO:"
"""

from __future__ import annotations

import shlex
from pathlib import Path

from tformer.cli._source import add_source_arguments, check_output, load_model
from tformer.core.atomic import check_output_dir
from tformer.core.errors import TformerError
from tformer.core.fmt import si
from tformer.interop.hf_config import hf_family

NAME = "export"
HELP = ("Export a model (--ckpt, --hf, --gguf or --preset) to a Hugging Face folder, an ONNX graph (--format onnx) "
        "or a GGUF file for llama.cpp (--format gguf).")
FORMATS = ("hf", "onnx", "gguf")


def add_arguments(parser) -> None:
    add_source_arguments(parser)
    parser.add_argument("--out", required=True, metavar="PATH",
                        help="the folder to write (hf, onnx); the .gguf file (gguf)")
    parser.add_argument("--format", default="hf", metavar="FORMAT",
                        help="hf: a Hugging Face folder (default); onnx: model.onnx + onnx.json, checked in ONNX "
                             "Runtime; gguf: one file for llama.cpp and ollama")
    parser.add_argument("--type", default=None, metavar="TYPE",
                        help="(gguf) the matrices' ggml type: f32 (default), f16, q8_0 or q4_1; norms and biases "
                             "stay f32")


def run(args) -> int:
    if args.format not in FORMATS:
        raise TformerError(f"--format {args.format} is unknown; choose one of: {', '.join(FORMATS)}")
    if args.set and not args.preset:
        raise TformerError("--set overrides a --preset's fields; a checkpoint keeps its own config")
    if args.type is not None and args.format != "gguf":
        raise TformerError(f"--type picks a GGUF file's tensor type; --format {args.format} has none "
                           "(use --format gguf)")
    check_output(args, args.out)  # inputs are never written: refused before any work
    # refuse an unwritable --out in the first second, not after the work (gguf: the folder the file goes in)
    check_output_dir(Path(args.out).expanduser().parent if args.format == "gguf" else args.out)
    if args.format == "gguf":
        return _run_gguf(args)
    if args.format == "onnx":
        return _run_onnx(args)
    # deferred: loaded only when this command runs, so `tformer --help` and the cost commands stay fast
    from tformer.interop.hf import save_hf

    out = Path(args.out)
    model, tokenizer, _ = load_model(args)
    model_type, _ = hf_family(model.config)  # a config no Hugging Face family can hold fails here, in one line
    save_hf(model, out)
    with_tokenizer = ""
    if tokenizer is not None:
        with_tokenizer = f" and the tformer tokenizer ({tokenizer.save(out).name})"
    n = sum(p.numel() for p in model.parameters())
    print(f"exported {model.config.name} ({n:,} parameters) as a Hugging Face {model_type} model{with_tokenizer} "
          f"to {out}")
    print(f"load it with: transformers.AutoModel{'' if model.config.has_encoder else 'ForCausalLM'}"
          f".from_pretrained({str(out)!r})")
    return 0


def _run_onnx(args) -> int:
    # deferred: torch and the exporter load only when this command runs
    from tformer.interop.config import load_config
    from tformer.interop.onnx_export import check_exportable, export_onnx

    if args.preset:
        check_exportable(load_config(args.preset, args.set))  # before building: an RNN preset fails here, in a second
    model, _, what = load_model(args)
    result = export_onnx(model, args.out)
    axes = ", ".join(f"{name} ({' x '.join(axes)})" for name, axes in result.inputs.items())
    print(f"exported {what} ({model.num_parameters():,} parameters) as ONNX opset {result.opset} to {result.path} "
          f"({result.bytes / 1e6:.1f} MB, {result.seconds:.1f} s): inputs {axes}; outputs {', '.join(result.outputs)}")
    shape = " x ".join(map(str, next(iter(result.checked_on.values()))))
    print(f"ONNX Runtime vs PyTorch on a {shape} input (another shape than the traced one, padding included): "
          f"max |difference| {result.max_difference:.2e}")
    return 0


def _run_gguf(args) -> int:
    # deferred: torch and the writer load only when this command runs
    from tformer.interop.config import load_config
    from tformer.interop.gguf_config import resolve_gguf
    from tformer.interop.gguf_vocab import keep_gguf_metadata
    from tformer.interop.gguf_write import check_type, gguf_architecture, save_gguf

    ggml_type = check_type(args.type or "f32")
    out = Path(args.out).expanduser()
    if out.is_dir():
        raise TformerError(f"--out {out} is a folder; --format gguf writes one file: give its path (name.gguf)")
    if args.preset:
        gguf_architecture(load_config(args.preset, args.set))  # an encoder or an RNN preset fails here, in a second
        raise TformerError("--format gguf needs the model's tokenizer (llama.cpp cannot run a model without one) and a "
                           "--preset has none; export a trained --ckpt, or an --hf / --gguf model")
    model, tokenizer, what = load_model(args)
    if args.gguf and tokenizer is not None:
        keep_gguf_metadata(tokenizer, resolve_gguf(args.gguf))  # its tokenizer metadata written back as read
    result = save_gguf(model, out, ggml_type, tokenizer)
    types = ", ".join(f"{kind} {count}" for kind, count in result.tensor_types.items())
    print(f"exported {what} ({model.num_parameters():,} parameters) as a GGUF {result.arch} model to {result.path} "
          f"({result.bytes:,} bytes, {si(result.bytes, 'B')}; type {result.ggml_type}): {result.tensors} tensors "
          f"({types}); tokenizer: {result.tokenizer}")
    for note in result.notes:
        print(f"note: {note}")
    print(f"run it with: llama-cli -m {shlex.quote(str(result.path))}, or ollama (a Modelfile: FROM {result.path})")
    return 0
