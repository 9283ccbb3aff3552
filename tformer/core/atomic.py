"""Write files and directories so that a crash never leaves a half-written one under the final name."""

from __future__ import annotations

import contextlib
import os
import shutil
import tempfile
from pathlib import Path


@contextlib.contextmanager
def atomic_dir(final: str | Path):
    """Yield a temporary directory beside ``final``; on success it replaces ``final`` in one rename.

    The old directory is moved aside first and removed last, so at every instant either the old
    or the new complete version exists (readers look for ``.NAME.old`` if NAME is missing).
    """
    final = Path(final)
    final.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{final.name}.tmp-", dir=final.parent))
    try:
        yield tmp
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    old = final.parent / f".{final.name}.old"
    if old.exists():
        shutil.rmtree(old)
    if final.exists():
        os.replace(final, old)
    os.replace(tmp, final)
    shutil.rmtree(old, ignore_errors=True)


def existing_dir(final: str | Path) -> Path | None:
    """The directory written by atomic_dir, or its previous version if a crash hit between renames."""
    final = Path(final)
    if final.is_dir():
        return final
    old = final.parent / f".{final.name}.old"
    return old if old.is_dir() else None


@contextlib.contextmanager
def atomic_path(path: str | Path):
    """Yield a temporary path beside ``path`` for a writer that wants a file name (safetensors, say);
    on success it is renamed to ``path``, on failure removed."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.tmp-", dir=path.parent)
    os.close(fd)
    try:
        yield Path(tmp)
        os.chmod(tmp, 0o644)  # mkstemp makes 0600; these are ordinary, shareable files
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp)
        raise


@contextlib.contextmanager
def atomic_file(path: str | Path, mode: str = "wb"):
    """Yield a file open for writing at a temporary name; on success it is synced and renamed to ``path``."""
    with atomic_path(path) as tmp, open(tmp, mode) as f:
        yield f
        f.flush()
        os.fsync(f.fileno())


def atomic_write_bytes(path: str | Path, data: bytes) -> None:
    with atomic_file(path, "wb") as f:
        f.write(data)


def atomic_write_text(path: str | Path, text: str) -> None:
    atomic_write_bytes(path, text.encode("utf-8"))


@contextlib.contextmanager
def atomic_files(directory: str | Path, names: tuple[str, ...]):
    """Yield a staging folder for the files ``names``; on success each replaces its namesake in ``directory``.

    For a folder that holds other files too (a tokenizer beside the weights): those are kept. The
    files move in the order of ``names`` (each rename atomic), so put the file that refers to the
    others last (config.json after model.safetensors). A ``directory`` that does not exist yet
    appears whole, in one rename.
    """
    directory = Path(directory)
    directory.parent.mkdir(parents=True, exist_ok=True)
    stage = Path(tempfile.mkdtemp(prefix=f".{directory.name}.tmp-", dir=directory.parent))
    try:
        yield stage
        missing = [n for n in names if not (stage / n).is_file()]
        if missing:
            raise FileNotFoundError(f"atomic_files: the writer left out {', '.join(missing)}")
        if not directory.exists():
            os.chmod(stage, 0o755)  # mkdtemp makes 0700; a saved model is meant to be shared
            os.rename(stage, directory)
            return
        for name in names:
            os.replace(stage / name, directory / name)
    finally:
        shutil.rmtree(stage, ignore_errors=True)


@contextlib.contextmanager
def atomic_new_dir(final: str | Path, marker: str):
    """Yield a temporary directory that becomes ``final`` in one rename, for caches built once.

    Unlike atomic_dir, an existing ``final`` is never replaced: when another process finished the
    same build first (its ``marker`` file is there), its copy is as good as ours and ours is dropped.
    """
    final = Path(final)
    final.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{final.name}.tmp-", dir=final.parent))
    try:
        yield tmp
        try:
            os.rename(tmp, final)
        except OSError:
            if not (final / marker).is_file():
                raise
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
