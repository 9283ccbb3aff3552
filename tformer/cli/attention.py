"""`tformer attention --walkthrough`: scaled dot-product attention worked through on small matrices;
`tformer attention --vit`: a digit cut into patch tokens and a small ViT's attention rollout, as text and pictures."""

import argparse
import json

from tformer.cli._cost_common import console
from tformer.core.errors import TformerError
from tformer.core.inputs import Bounds

NAME = "attention"
HELP = ("Attention made visible: --walkthrough prints Q, K, V, Q Kᵀ, √d_k, softmax and output step by step; "
        "--vit shows a digit as patch tokens and a ViT's attention rollout")

NUMBERS = {"decimals": Bounds(0, 15, integer=True, note="float64 holds about 16 significant digits"),
           "heads": Bounds(1, 1024, integer=True), "steps": Bounds(0, 10 ** 6, integer=True)}

_EPILOG = """\
the built-in example: tokens I, love, tea; X is 3×4; W_Q, W_K, W_V are 4×2 (d_k = 2).
With --heads 2 it uses 4×4 projections (head 1 = the one-head matrices, head 2 = two more columns)
and a 4×4 W_O. All entries are small integers, so every step can be redone by hand.

--input FILE.json: an object with
  "X":   T×d_model, one row per token              (required)
  "W_Q": d_model × (heads·d_k)                     (required)
  "W_K": d_model × (heads·d_k)                     (required)
  "W_V": d_model × (heads·d_v)                     (required)
  "W_O": (heads·d_v) × d_out                       (optional; without it the output is the concatenation)
  "tokens": ["I", "love", "tea"]                   (optional; default t1, t2, ...)
  Matrices are lists of rows. With --heads N, head h (1..N) uses columns (h-1)·d_k+1 .. h·d_k of W_Q
  and W_K (and likewise of W_V), the way the model's attention splits its projections.
--input FILE.csv: X only, one token per line, e.g. "love,0,1,2,0" (the first cell is an optional
  token label; lines starting with # are skipped); the weights are the built-in ones, so X needs 4 columns.

--vit: a held-out 8x8 digit (scikit-learn's scans) cut into 2x2 patches (16 tokens + [CLS] = 17), a 3-layer
  ViT trained on the other digits for --steps Adam steps (seeded; about 13 s), its held-out accuracy and the
  attention rollout of [CLS] over the patches; --out DIR saves vit_patches.png and vit_rollout.png.

example: tformer attention --walkthrough --causal --heads 2 --decimals 4
         tformer attention --vit --out vit-pictures
"""


def add_arguments(parser) -> None:
    parser.formatter_class = argparse.RawDescriptionHelpFormatter
    parser.epilog = _EPILOG
    parser.add_argument("--walkthrough", action="store_true",
                        help="print attention step by step for small matrices (the built-in example or --input)")
    parser.add_argument("--causal", action="store_true", help="apply the causal mask: no token sees a later one")
    parser.add_argument("--heads", type=int, default=1, metavar="N",
                        help="split the projections into N heads (built-in example: 1 or 2; default 1)")
    parser.add_argument("--input", metavar="FILE", help="your own matrices: JSON (X, W_Q, W_K, W_V, optional "
                        "W_O and tokens) or a CSV holding X; format below")
    parser.add_argument("--decimals", type=int, default=3, metavar="N",
                        help="decimal places printed (default 3; integers print as integers)")
    parser.add_argument("--json", action="store_true",
                        help="every intermediate matrix as exact float64 lists (masked -inf as null)")
    parser.add_argument("--vit", action="store_true",
                        help="a digit cut into patch tokens, and a small trained ViT's attention rollout over it")
    parser.add_argument("--steps", type=int, default=None, metavar="N",
                        help="--vit: training steps of the small ViT (default 800; 0 = untrained)")
    parser.add_argument("--out", metavar="DIR", help="--vit: save the two pictures (PNG) in DIR")


def run(args) -> int:
    if args.walkthrough == args.vit:
        raise TformerError("say what to show: `tformer attention --walkthrough` or `tformer attention --vit` "
                           "(one of them; see --help for the options)")
    if args.vit:
        return _vit(args)
    if args.steps is not None or args.out:
        raise TformerError("--steps and --out go with --vit; the walkthrough prints to the terminal")
    if not 0 <= args.decimals <= 15:
        raise TformerError(f"--decimals must be between 0 and 15, got {args.decimals}")
    if args.heads < 1:
        raise TformerError(f"--heads must be at least 1, got {args.heads}")


    # deferred: loaded only when this command runs, so `tformer --help` and the cost commands stay fast
    from tformer.teach.examples import default_example, load_example
    from tformer.teach.walkthrough import run as walk
    from tformer.teach.walkthrough import to_dict

    example = load_example(args.input, args.heads) if args.input else default_example(args.heads)
    w = walk(example, heads=args.heads, causal=args.causal)
    if args.json:
        print(json.dumps(to_dict(w), indent=1, allow_nan=False))
        return 0

    # deferred: loaded only when this command runs, so `tformer --help` and the cost commands stay fast
    from tformer.teach.render import render

    render(w, args.decimals, console())
    return 0


def _vit(args) -> int:
    if args.input or args.causal or args.heads != 1:
        raise TformerError("--input, --causal and --heads belong to --walkthrough; --vit reads the digits")
    if args.steps is not None and args.steps < 0:
        raise TformerError(f"--steps must be 0 or more, got {args.steps}")
    # deferred: torch and matplotlib load only when this command runs
    from tformer.teach.digit_vit import STEPS, train_digit_vit
    from tformer.teach.vit_walk import render, save_pictures, to_dict

    run = train_digit_vit(steps=STEPS if args.steps is None else args.steps)
    saved = save_pictures(run, args.out) if args.out else None
    data = to_dict(run)
    if args.json:
        data["pictures"] = [str(s) for s in saved or []]
        print(json.dumps(data, indent=1, allow_nan=False))
        return 0
    render(run, data, saved, console())
    return 0
