"""Every command's arguments checked where they enter, before the command runs (not a command itself).

Three rules for every command, so a new flag is covered the day it is added:
- every text argument is valid UTF-8 (a shell hands over raw bytes; Python gives the undecodable ones as lone
  surrogates, which no tokenizer, file name or terminal takes);
- a flag that names a preset, a model, a corpus, a device or a file is not empty, blank, '.' where a folder is
  no answer, or holding a control character;
- no number is nan, and no whole number is past 64 bits (no count tformer takes comes near).
Then a command's own ranges: its module's NUMBERS, {dest: tformer.core.inputs.Bounds}, and every seed flag's
(a whole number in [0, 2**64 - 1]).
"""

from __future__ import annotations

import math

from tformer.core.errors import TformerError
from tformer.core.inputs import Bounds, check_name, check_text, shown

# dest -> (what the flag expects, whether a folder is an answer)
NAMES = {
    "preset": ("a preset name (see `tformer presets`)", False),
    "config": ("a config file or a model folder", True),
    "hardware": ("a device from `tformer specs`, a JSON file or 'measured'", False),
    "input": ("a JSON or CSV file", False),
    "objective": ("an objective name", False),
    "hf": ("a Hugging Face model folder or a packaged model's name", True),
    "ckpt": ("a checkpoint folder", True),
    "gguf": ("a GGUF file or a packaged model's name", False),
    "from_": ("a model: a packaged name, a preset or a folder", True),
    "out": ("an output folder", True),
    "data": ("a corpus name, or a text file or folder", True),
    "tokenizer": ("a tokenizer name or folder", True),
    "name": ("a corpus name, or a text file or folder", True),
}
INT_LIMIT = 2 ** 64  # a seed takes up to 2**64 - 1; every count is far below
# Every seed flag (--seed, --data-seed, ...): what torch's and numpy's generators both take.
SEED = Bounds(0, INT_LIMIT - 1, integer=True, note="a seed")


def flag_names(parser) -> dict[str, str]:
    """{dest: the flag as a user types it (the long form), or a positional's name}, the arguments of a command's
    own subcommands (`tformer data get NAME`) included."""
    out = {}
    # argparse has no public list of a parser's arguments; _actions is what its own help formatter reads.
    for action in parser._actions:
        choices = action.choices if isinstance(action.choices, dict) else {}
        for sub in choices.values():  # a subparsers action: {subcommand: its parser}
            for dest, flag in flag_names(sub).items():
                out.setdefault(dest, flag)
        longs = [o for o in action.option_strings if o.startswith("--")]
        out.setdefault(action.dest, longs[0] if longs else (action.option_strings or [action.metavar or action.dest])[0])
    return out


def check_arguments(parser, args, numbers: dict[str, Bounds]) -> None:
    """Raise one TformerError, naming the flag, for the first argument the rules above refuse."""
    flags = flag_names(parser)
    numbers = {**{d: SEED for d in flags if d == "seed" or d.endswith("_seed")}, **numbers}
    for dest, flag in flags.items():
        value = getattr(args, dest, None)
        if dest in numbers and not isinstance(value, str):
            continue  # its own range says more than the net below
        for item in value if isinstance(value, list) else [value]:
            _check_value(dest, flag, item)
    for dest, bounds in numbers.items():
        value = getattr(args, dest, None)
        if value is not None:
            bounds.check(value, flags.get(dest, "--" + dest.replace("_", "-")))


def _check_value(dest: str, flag: str, value) -> None:
    if isinstance(value, str):
        check_text(value, flag)
        if dest in NAMES:
            expected, folder_ok = NAMES[dest]
            # A device may be described inline as JSON, which may span lines: only its text is checked.
            if not (dest == "hardware" and value.lstrip().startswith("{")):
                check_name(value, flag, folder_ok=folder_ok, expected=expected)
    elif isinstance(value, float) and math.isnan(value):
        raise TformerError(f"{flag} is nan, which is not a number; give a finite number")
    elif isinstance(value, int) and not isinstance(value, bool) and not -INT_LIMIT < value < INT_LIMIT:
        raise TformerError(f"{flag} is {shown(value)}, beyond any count tformer takes; give a smaller number")
