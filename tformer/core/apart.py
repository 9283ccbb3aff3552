"""Inputs are read-only: an output path may not be an input, lie inside one, or contain one.

Every command that reads a model, run or file and writes an output calls ``check_apart`` before any work.
Paths are compared resolved (symlinks followed, ``..`` folded), so a link or a relative spelling cannot
slip an output onto an input. A model folder that is part of a training run (its checkpoint/ or final/
beside the run's metrics) stands for the whole run: writing into the run would change what ``--resume``
continues from.
"""

from __future__ import annotations

from collections.abc import Iterable
from pathlib import Path

from tformer.core.errors import TformerError

RUN_MARKERS = ("metrics.jsonl", "train_args.json")  # files a training run's --out folder holds (tformer.train)


def run_of(path: str | Path) -> Path | None:
    """The training run a model folder belongs to (its parent, when that is a run), else None."""
    path = Path(path).expanduser()
    parent = path.resolve().parent
    if path.resolve().name in ("checkpoint", "final") and any((parent / m).exists() for m in RUN_MARKERS):
        return parent
    return None


def guarded(flag: str, path: str | Path) -> list[tuple[str, Path]]:
    """``(what, path)`` pairs to keep an output apart from: the input, and the run it belongs to."""
    path = Path(path).expanduser()
    pairs = [(f"the {flag} {'file' if path.is_file() else 'folder'} {path}", path)]
    run = run_of(path)
    if run is not None:
        pairs.append((f"the training run {run} that {flag} {path} belongs to", run))
    return pairs


def check_apart(out: str | Path, inputs: Iterable[tuple[str, str | Path]], what: str = "--out") -> None:
    """Refuse, in one line, an output that is an input, lies inside one, or contains one.

    ``inputs``: ``(description, path)`` pairs, e.g. from ``guarded``. Inputs that do not exist are skipped
    (a packaged name, a preset): nothing on disk can be overwritten there.
    """
    out_path = Path(out).expanduser()
    target = out_path.resolve()
    for description, path in inputs:
        path = Path(path).expanduser()
        if not path.exists():
            continue
        source = path.resolve()
        if target == source:
            raise TformerError(f"{what} {out_path} is {description} itself; inputs are never overwritten: "
                               f"choose a new folder for {what}")
        if source in target.parents:
            raise TformerError(f"{what} {out_path} lies inside {description}; writing there would change the "
                               f"input: choose a folder outside it")
        if target in source.parents:
            raise TformerError(f"{what} {out_path} contains {description}; writing there could replace the "
                               f"input: choose a folder that does not hold it")


__all__ = ["check_apart", "guarded", "run_of"]
