"""`tformer quantize`: a tformer checkpoint with its Linears weight-only quantized, saved as a checkpoint.

    tformer quantize --ckpt runs/shakespeare --to int8 --out runs/shakespeare-int8
    tformer quantize --ckpt runs/shakespeare --to int4 --group 64 --out runs/shakespeare-int4
    tformer quantize --ckpt runs/shakespeare --to q4_1 --out runs/shakespeare-q4_1
    tformer generate --ckpt runs/shakespeare-int8 --prompt "ROMEO:"

Every Linear of the layers and the LM head becomes int8 (one scale per output row) or int4 (a scale and zero
per --group inputs), or GGUF's blocks, what llama.cpp's files hold (q8_0: 32 int8 weights and an fp16 scale; q4_1:
4-bit with a scale and a minimum; q5_0: 5-bit; q4_k and q6_k: llama.cpp's K-quants, written in one pass without its
search for the best scales). A tied LM head in a block format is the token table too: the lookup reads its rows (as
llama.cpp reads token_embd). Other embeddings and the norms stay float (tformer.adapt.quantize). The folder holds config.json
(quantize, quant_group) + model.safetensors (no pickle), and the run's tokenizer, copied. Weight-only
quantization is for inference: training refuses a quantized config.
"""

from __future__ import annotations

import json
from pathlib import Path

from tformer.cli._source import add_source_arguments, check_output, load_model
from tformer.core import fmt
from tformer.core.atomic import check_output_dir
from tformer.core.config import QUANT_GROUPS
from tformer.core.errors import TformerError

NAME = "quantize"
HELP = ("Quantize a checkpoint's weights to int8, int4 or a GGUF block format (q8_0, q4_1, q5_0, q4_k, q6_k; "
        "weight-only, for inference) into a new checkpoint.")
TARGETS = ("int8", "int4", "q8_0", "q4_1", "q5_0", "q4_k", "q6_k")  # tformer.adapt.quantize.TARGETS, repeated so --help loads no torch


def add_arguments(parser) -> None:
    add_source_arguments(parser)
    parser.add_argument("--to", required=True, metavar="BITS", help="int8 (per output row), int4 (grouped), q8_0 or q4_1 (GGUF's blocks of 32)")
    parser.add_argument("--group", type=int, default=None, metavar="N",
                        help=f"int4: inputs per scale and zero, one of {', '.join(map(str, QUANT_GROUPS))} "
                             "(default 32)")
    parser.add_argument("--out", required=True, metavar="DIR", help="the folder for the quantized checkpoint")
    parser.add_argument("--json", action="store_true", help="machine-readable output (exact byte counts)")


def run(args) -> int:
    if args.to not in TARGETS:
        raise TformerError(f"--to {args.to} is not a supported quantization; choose one of: {', '.join(TARGETS)}")
    if args.group is not None and args.to == "int4" and args.group not in QUANT_GROUPS:
        raise TformerError(f"--group {args.group} is not a supported int4 group size; choose one of: "
                           f"{', '.join(map(str, QUANT_GROUPS))}")
    out = Path(args.out)
    check_output(args, out)  # inputs are never written: refused before any work
    check_output_dir(args.out)  # refuse an unwritable --out in the first second, not after the work
    # deferred: loaded only when this command runs, so `tformer --help` and the cost commands stay fast
    from tformer.adapt.quantize import quantize_model
    from tformer.interop.checkpoint import WEIGHTS_FILE, save_model

    model, tokenizer, _ = load_model(args)
    quantized = quantize_model(model, args.to, args.group)
    save_model(quantized, out)
    if tokenizer is not None:
        tokenizer.save(out / "tokenizer")
    # Both sides as tformer writes them (the source may be a Hugging Face folder or a preset, in another layout).
    before = _weight_bytes(model)
    after = (out / WEIGHTS_FILE).stat().st_size
    c = quantized.config
    what = f"{c.quantize}" + (f" (group {c.quant_group})" if c.quant_group else "")
    if args.json:
        print(json.dumps({"out": str(out), "quantize": c.quantize, "quant_group": c.quant_group,
                          "bytes_before": before, "bytes_after": after}, indent=1))
        return 0
    print(f"quantized {c.name} to {what}: weights {fmt.nbytes(before)} -> {WEIGHTS_FILE} {fmt.nbytes(after)} "
          f"({before / after:.2f}x smaller), saved to {out}")
    return 0


def _weight_bytes(model) -> int:
    """The bytes of the model's distinct tensors (a tied embedding once), as a checkpoint stores them."""
    seen, total = set(), 0
    for t in list(model.parameters()) + list(model.buffers()):
        if t.data_ptr() not in seen:
            seen.add(t.data_ptr())
            total += t.numel() * t.element_size()
    return total
