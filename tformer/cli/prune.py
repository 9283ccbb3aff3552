"""`tformer prune`: a smaller or sparser copy of a checkpoint.

    tformer prune --ckpt runs/shakespeare --heads 1 --ffn 0.25 --out runs/pruned      # structured: smaller model
    tformer prune --ckpt runs/shakespeare --sparsity 0.5 --out runs/sparse             # unstructured: zeros
    tformer prune --hf all-minilm-l6-v2 --heads 2 --out runs/minilm-pruned            # any model source

Structured pruning removes the ``--heads`` least important heads of every attention and ``--ffn`` of every feed-forward
block's neurons (each layer ranks its own, by weight norms), so the saved model is smaller and the ledger recounts it
(`tformer count --config OUT`). Magnitude pruning zeroes the smallest ``--sparsity`` of the stacks' Linear weights,
ranked over all of them together (or within each matrix with ``--per-layer``): the shapes, and the time a dense
kernel takes, stay the same. The output is a tformer checkpoint (config.json + model.safetensors) with the tokenizer
copied beside it, written atomically.
"""

from __future__ import annotations

from pathlib import Path

from tformer.cli._source import add_source_arguments, check_output, load_model
from tformer.core.atomic import check_output_dir
from tformer.core.errors import TformerError

NAME = "prune"
HELP = "Prune a checkpoint: remove attention heads and FFN neurons, or zero its smallest weights."


def add_arguments(parser) -> None:
    add_source_arguments(parser)
    parser.add_argument("--out", required=True, metavar="DIR", help="the folder to write the pruned checkpoint to")
    parser.add_argument("--heads", type=int, default=0, metavar="N", help="heads to remove from every attention")
    parser.add_argument("--ffn", type=float, default=0.0, metavar="F",
                        help="fraction of every feed-forward block's neurons to remove, in [0, 1)")
    parser.add_argument("--sparsity", type=float, default=None, metavar="S",
                        help="zero this fraction of the weights instead (magnitude pruning, in [0, 1))")
    parser.add_argument("--per-layer", action="store_true",
                        help="with --sparsity: the same sparsity in every matrix (default: one global threshold)")


def run(args) -> int:
    structured = bool(args.heads or args.ffn)
    if args.sparsity is None and not structured:
        raise TformerError("nothing to prune; give --heads N and/or --ffn F (structured) or --sparsity S (magnitude)")
    if args.sparsity is not None and structured:
        raise TformerError("--sparsity zeroes weights and --heads/--ffn remove them; choose one kind per run")
    if args.per_layer and args.sparsity is None:
        raise TformerError("--per-layer applies to --sparsity; drop it or give --sparsity")
    out = Path(args.out)
    check_output(args, out)  # inputs are never written: refused before any work
    check_output_dir(args.out)  # an unwritable --out fails in the first second, not after the work
    # deferred: torch and the model load only when this command runs, so `tformer --help` stays fast
    from tformer.adapt.prune import magnitude_prune, prune_structured
    from tformer.interop.checkpoint import save_model

    model, tokenizer, _ = load_model(args)
    before = sum(p.numel() for p in model.parameters())
    if structured:
        pruned = prune_structured(model, heads=args.heads, ffn=args.ffn)
        after = sum(p.numel() for p in pruned.parameters())
        c = pruned.config
        what = (f"{args.heads} head(s) and {int(args.ffn * model.config.d_ff)} FFN neuron(s) removed per layer "
                f"(now {c.n_heads} heads x {c.head_dim}, d_ff {c.d_ff}): {before:,} -> {after:,} parameters "
                f"({after / before:.1%})")
    else:
        pruned, achieved = magnitude_prune(model, args.sparsity, per_layer=args.per_layer)
        what = (f"{achieved['total']:.1%} of the stacks' Linear weights zeroed "
                f"({'each matrix' if args.per_layer else 'one global threshold'}); {before:,} parameters, "
                "shapes unchanged (a dense kernel takes the same time)")
    save_model(pruned, out)
    if tokenizer is not None:
        tokenizer.save(out)
    print(f"pruned {model.config.name}: {what}")
    print(f"saved to {out}; cost it with: tformer count --config {out / 'config.json'}")
    return 0
