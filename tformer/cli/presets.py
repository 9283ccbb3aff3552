"""`tformer presets`: the named model configurations and their sizes."""

import json

from tformer.cli._cost_common import console
from tformer.core.config import preset, preset_names
from tformer.cost.ledger import Workload, ledger

NAME = "presets"
HELP = "List the named model presets (architecture, sizes, parameters)."


def add_arguments(parser) -> None:
    parser.add_argument("--json", action="store_true", help="print the full configs as JSON")


def preset_params(config) -> int:
    """Parameters of ``config`` by the ledger (tests hold it equal to the built model's numel), so
    listing the presets never imports torch. One token is enough: parameters do not depend on it."""
    return ledger(config, Workload(phase="forward", batch=1, seq=1)).params["total"]


def _vocab_and_context(c) -> tuple[str, str]:
    """A text model's vocabulary and context; an image model's tokens per image (n = HW/P^2 + 1) beside them."""
    if not c.traits.images:
        return f"{c.vocab_size:,}", str(c.max_positions)
    image = f"{c.image_tokens} img ({c.image_size}px/{c.patch_size})"
    if c.traits.two_towers:  # a text tower beside the image tower
        return f"{c.vocab_size:,}", f"{c.max_positions} text, {image}"
    return "-", image


def run(args) -> int:
    rows = []
    for name in preset_names():
        config = preset(name)
        rows.append((name, config, preset_params(config)))
    if args.json:
        print(json.dumps({name: {**config.to_dict(), "params": params} for name, config, params in rows}, indent=1))
        return 0
    from rich.table import Table  # deferred: --json output never loads rich

    table = Table(title="tformer presets (params: every tensor once, tied embeddings once)")
    for col in ("preset", "arch", "layers", "d_model", "heads (kv)", "d_ff", "vocab", "context", "position", "params"):
        table.add_column(col, justify="right" if col not in ("preset", "arch", "position") else "left")
    for name, c, params in rows:
        layers = f"{c.n_layers}+{c.n_decoder_layers}" if c.traits.seq2seq else str(c.n_layers)
        table.add_row(name, c.arch, layers, str(c.d_model), f"{c.n_heads} ({c.n_kv_heads})", str(c.d_ff),
                      *_vocab_and_context(c), c.position, f"{params:,}")
    console().print(table)
    return 0
