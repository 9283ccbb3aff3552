"""`tformer attention --walkthrough`: scaled dot-product attention worked through on small matrices."""

import argparse
import json

from tformer.cli._cost_common import console
from tformer.core.errors import TformerError

NAME = "attention"
HELP = "Attention made visible: --walkthrough prints Q, K, V, Q Kᵀ, √d_k, softmax and output step by step."

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

example: tformer attention --walkthrough --causal --heads 2 --decimals 4
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


def run(args) -> int:
    if not args.walkthrough:
        raise TformerError("say what to show: `tformer attention --walkthrough` (see --help for the options)")
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
