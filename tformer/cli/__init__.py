"""`tformer <command>`: one entry point, one module per subcommand in tformer/cli/.

Each command module defines NAME, HELP, add_arguments(parser) and run(args) -> int. Heavy
imports happen inside run(), so `tformer --help` stays instant.
"""

from __future__ import annotations

import argparse
import importlib
import sys

from tformer import __version__
from tformer.core.errors import TformerError

# Commands listed here come first in --help, in this order; any other module in
# tformer/cli/ follows alphabetically.
COMMAND_ORDER = ["report", "count", "scale", "specs", "bench", "profile", "train", "generate", "translate", "export",
                 "data", "attention", "presets", "demo"]


def command_modules() -> list[str]:
    import pkgutil

    import tformer.cli

    found = [m.name for m in pkgutil.iter_modules(tformer.cli.__path__) if not m.name.startswith("_")]
    ordered = [name for name in COMMAND_ORDER if name in found] + sorted(set(found) - set(COMMAND_ORDER))
    return [f"tformer.cli.{name}" for name in ordered]


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="tformer",
        description="Transformers you can read, run and measure.",
    )
    parser.add_argument("--version", action="version", version=f"tformer {__version__}")
    sub = parser.add_subparsers(dest="command", metavar="<command>")
    for module_name in command_modules():
        module = importlib.import_module(module_name)
        p = sub.add_parser(module.NAME, help=module.HELP, description=module.HELP)
        module.add_arguments(p)
        p.set_defaults(_run=module.run)
    return parser


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    if not getattr(args, "_run", None):
        parser.print_help()
        return 0
    try:
        return int(args._run(args) or 0)
    except TformerError as exc:
        print(f"tformer {args.command}: error: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print(f"tformer {args.command}: interrupted", file=sys.stderr)
        return 130


if __name__ == "__main__":
    sys.exit(main())
