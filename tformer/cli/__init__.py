"""`tformer <command>`: one entry point, one module per subcommand in tformer/cli/.

Each command module defines NAME (its file name), HELP, add_arguments(parser) and run(args) -> int, and may
define NUMBERS ({dest: tformer.core.inputs.Bounds}): its flags' ranges, checked with the rules every command's
arguments meet (tformer/cli/_checks.py) before run is called.
A command line that names a command imports that command's module only, so `tformer count` loads the
ledger and nothing else (no torch); `tformer --help` imports them all. Command modules import torch
only inside run(), so the help stays quick too.
"""

from __future__ import annotations

import argparse
import importlib
import pkgutil
import sys

from tformer import __version__
from tformer.cli._checks import check_arguments
from tformer.core.atomic import known_os_error, os_error_message
from tformer.core.errors import TformerError, error_line

# Commands listed here come first in --help, in this order; any other module in
# tformer/cli/ follows alphabetically.
COMMAND_ORDER = ["report", "count", "scale", "specs", "bench", "profile", "train", "finetune", "generate", "perplexity",
                 "translate", "serve", "export", "quantize", "prune", "data", "attention", "presets", "demo"]

__all__ = ["COMMAND_ORDER", "build_parser", "command_modules", "main"]


def command_modules() -> list[str]:
    found = [m.name for m in pkgutil.iter_modules(__path__) if not m.name.startswith("_")]
    ordered = [name for name in COMMAND_ORDER if name in found] + sorted(set(found) - set(COMMAND_ORDER))
    return [f"tformer.cli.{name}" for name in ordered]


def build_parser(only: str | None = None) -> argparse.ArgumentParser:
    """The parser with every command, or with the one named ``only`` (a command's NAME is its module's name)."""
    parser = argparse.ArgumentParser(
        prog="tformer",
        description="Transformers you can read, run and measure.",
    )
    parser.add_argument("--version", action="version", version=f"tformer {__version__}")
    sub = parser.add_subparsers(dest="command", metavar="<command>")
    modules = command_modules()
    if f"tformer.cli.{only}" in modules:
        modules = [f"tformer.cli.{only}"]
    for module_name in modules:
        module = importlib.import_module(module_name)
        p = sub.add_parser(module.NAME, help=module.HELP, description=module.HELP)
        module.add_arguments(p)
        # The parser and the command's ranges travel with the parsed arguments: main checks them before run.
        p.set_defaults(_run=module.run, _parser=p, _numbers=getattr(module, "NUMBERS", {}))
    return parser


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else list(argv)
    named = next((a for a in argv if not a.startswith("-")), None)
    parser = build_parser(only=named)
    args = parser.parse_args(argv)
    if not getattr(args, "_run", None):
        parser.print_help()
        return 0
    try:
        check_arguments(args._parser, args, args._numbers)
        return int(args._run(args) or 0)
    except TformerError as exc:
        print(error_line(f"tformer {args.command}: error: {exc}"), file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print(f"tformer {args.command}: interrupted", file=sys.stderr)
        return 130
    except OSError as exc:
        # The last net, for an OS fault on a path no writer or reader wrapped: still one line with the
        # cause and the fix. An OSError without a known cause is a bug and keeps its traceback.
        if not known_os_error(exc):
            raise
        print(error_line(f"tformer {args.command}: error: {os_error_message(exc)}"), file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
