"""`tformer presets`: the named model configurations and their sizes."""

NAME = "presets"
HELP = "List the named model presets (architecture, sizes, parameters)."


def add_arguments(parser) -> None:
    parser.add_argument("--json", action="store_true", help="print the full configs as JSON")


def run(args) -> int:
    import json

    from tformer.core.config import preset, preset_names
    from tformer.model import build

    rows = []
    for name in preset_names():
        config = preset(name)
        params = build(config, device="meta").num_parameters()
        rows.append((name, config, params))
    if args.json:
        print(json.dumps({name: {**config.to_dict(), "params": params} for name, config, params in rows}, indent=1))
        return 0
    from rich.console import Console
    from rich.table import Table

    table = Table(title="tformer presets (params: every tensor once, tied embeddings once)")
    for col in ("preset", "arch", "layers", "d_model", "heads (kv)", "d_ff", "vocab", "context", "position", "params"):
        table.add_column(col, justify="right" if col not in ("preset", "arch", "position") else "left")
    for name, c, params in rows:
        layers = f"{c.n_layers}+{c.n_decoder_layers}" if c.traits.seq2seq else str(c.n_layers)
        table.add_row(name, c.arch, layers, str(c.d_model), f"{c.n_heads} ({c.n_kv_heads})", str(c.d_ff),
                      f"{c.vocab_size:,}", str(c.max_positions), c.position, f"{params:,}")
    Console().print(table)
    return 0
