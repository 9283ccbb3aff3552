"""`tformer export`: a model (a run, a Hugging Face folder, a preset) as a Hugging Face folder or an ONNX graph.

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
"""

from __future__ import annotations

from pathlib import Path

from tformer.cli._source import add_source_arguments, check_output, load_model
from tformer.core.atomic import check_output_dir
from tformer.core.errors import TformerError
from tformer.interop.hf_config import hf_family

NAME = "export"
HELP = "Export a model (--ckpt, --hf or --preset) to a Hugging Face folder or an ONNX graph (--format onnx)."
FORMATS = ("hf", "onnx")


def add_arguments(parser) -> None:
    add_source_arguments(parser)
    parser.add_argument("--out", required=True, metavar="DIR", help="the folder to write")
    parser.add_argument("--format", default="hf", metavar="FORMAT",
                        help="hf: a Hugging Face folder (default); onnx: model.onnx + onnx.json, checked in ONNX Runtime")


def run(args) -> int:
    if args.format not in FORMATS:
        raise TformerError(f"--format {args.format} is unknown; choose one of: {', '.join(FORMATS)}")
    if args.set and not args.preset:
        raise TformerError("--set overrides a --preset's fields; a checkpoint keeps its own config")
    check_output(args, args.out)  # inputs are never written: refused before any work
    check_output_dir(args.out)  # refuse an unwritable --out in the first second, not after the work
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

