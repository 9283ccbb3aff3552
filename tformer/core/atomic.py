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
