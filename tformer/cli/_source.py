"""The model source every command that reads a model accepts (not a command itself): --ckpt, --gguf, --hf (a folder
or a packaged name), --preset (random init, --set, --seed). One argument group and one loader, so generate,
chat, perplexity, translate, serve, export, quantize and prune take the same sources and say the same things
about them; and check_output, which every command that writes keeps apart from what it reads."""

from __future__ import annotations

from pathlib import Path

from tformer.core.apart import check_apart, guarded
from tformer.core.errors import TformerError

GGUF_WEIGHTS = ("auto", "kernel", "keep", "dequantize")  # tformer.interop.gguf_model.WEIGHTS, repeated so --help loads no torch


def add_source_arguments(parser, preset: bool = True, seed: bool = True, gguf_weights: str | None = None,
                         runs: bool = False) -> None:
    """``seed=False`` where the command has a --seed of its own (generate's sampler): a preset starts from it too.
    ``runs``: the command runs the model (generate, chat, serve, perplexity, translate), so it offers --bf16-kernel.
    ``gguf_weights``: the default of --gguf-weights; None: "auto" for a command that runs the model (the block
    kernel where it is built: decoding reads the weights once a token, and the kernel reads a fifth of fp32's bytes;
    generate, chat and serve give the same tokens on it, row-exact attention included), "dequantize" for one that
    only reads or rewrites the weights (export, quantize, prune: fp32 in, the exact values)."""
    if gguf_weights is None:
        gguf_weights = "auto" if runs else "dequantize"
    src = parser.add_mutually_exclusive_group(required=True)
    src.add_argument("--ckpt", metavar="DIR",
                     help="a training output folder (or its checkpoint/ folder): config.json + model.safetensors")
    src.add_argument("--hf", metavar="DIR|NAME",
                     help="a local Hugging Face model folder (config.json, weights, tokenizer.json), or a packaged "
                          "checkpoint's name (all-minilm-l6-v2)")
    src.add_argument("--gguf", metavar="FILE|NAME",
                     help="a GGUF file (llama.cpp's format: weights, tokenizer and chat template in one file), or a "
                          "packaged one: smollm2-135m-instruct, gemma3-270m")
    parser.add_argument("--gguf-weights", choices=GGUF_WEIGHTS, default=gguf_weights,
                        help="(--gguf) kernel: hold Q8_0/Q4_1/Q5_0/Q4_K/Q6_K matrices in the file's blocks (about a "
                             "fifth of fp32's memory) and run them on tformer's block kernel, activations rounded to 8 "
                             "bits per block of 32 as llama.cpp does (the fast path); keep: the same blocks widened "
                             "exactly at each product (fp32's numbers, slower); dequantize: widen every matrix to fp32 "
                             "once; auto: kernel where it is built, widening what it does not run, else dequantize "
                             f"(default: {gguf_weights})")
    if runs:
        parser.add_argument("--bf16-kernel", action="store_true",
                            help="run kept or quantized matrices on torch's packed int4/int8 CPU kernels: bf16 "
                                 "activations and outputs, faster than keep, and answers may differ from fp32's by "
                                 "bf16 rounding (a greedy pick between close tokens)")
    if preset:
        src.add_argument("--preset", metavar="NAME", help="a preset (see `tformer presets`), randomly initialised")
        parser.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                            help="(--preset) override a config field")
        if seed:
            parser.add_argument("--seed", type=int, default=0, help="(--preset) the initialisation seed")


def load_model(args):
    """(model, tokenizer or None, label) from the parsed source arguments."""
    # deferred: torch and the loaders load only when a command runs, so `tformer --help` stays fast
    from tformer.interop.source import load_source

    model, tokenizer, label = load_source(args.ckpt, args.hf, getattr(args, "preset", None),
                                          getattr(args, "set", None) or (), getattr(args, "seed", None) or 0,
                                          gguf=args.gguf, gguf_weights=getattr(args, "gguf_weights", "auto"))
    if getattr(args, "bf16_kernel", False):
        from tformer.model.quantized import use_path  # deferred with the loaders: torch

        if not use_path(model, "kernel"):
            raise TformerError("--bf16-kernel runs quantized matrices, and this model has none: load a GGUF file with "
                               "--gguf-weights keep, or a checkpoint from `tformer quantize`")
    return model, tokenizer, label


def check_output(args, out: str | Path, what: str = "--out", flags=("--ckpt", "--hf", "--gguf")) -> None:
    """Refuse an output that is an input the flags name, lies inside one, or holds one (a checkpoint's run too).

    ``flags``: the command's input flags; those not given, or naming no path on disk (a preset, a packaged
    name, a corpus name), are skipped."""
    pairs = []
    for flag in flags:
        name = flag.lstrip("-").replace("-", "_")
        value = getattr(args, name, None) or getattr(args, name + "_", None)  # --from is stored as from_
        if value:
            pairs += guarded(flag, value)
    check_apart(out, pairs, what)
