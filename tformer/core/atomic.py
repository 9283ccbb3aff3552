"""Write files and directories so that a crash never leaves a half-written one under the final name.

Every helper writes under a temporary name in the destination's own folder (so the last step is a
rename on one filesystem), fsyncs what it wrote, renames, and fsyncs the folder where the OS allows.
Any OS error on the way (a full disk, no permission, a read-only filesystem, a file where a folder
should be, a name too long ...) removes the temporary and surfaces as one WriteError (a TformerError)
that names the path, the cause in words and the fix. check_output_dir runs the same checks on an
output folder before a command starts its work.
"""

from __future__ import annotations

import contextlib
import errno
import os
import re
import shutil
import tempfile
from pathlib import Path

from tformer.core.errors import TformerError

# Free space below which an output folder is refused up front: nothing tformer writes fits in less.
MIN_FREE_BYTES = 1 << 20

# errno -> (the cause in words, the fix); "{what}" is the flag or kind of path the user chose.
_CAUSES = {
    errno.ENOSPC: ("no space left on the device", "free space or choose another {what}"),
    errno.EDQUOT: ("disk quota exceeded", "free space or choose another {what}"),
    errno.EACCES: ("permission denied", "choose a folder you can write to, or fix its permissions"),
    errno.EPERM: ("operation not permitted", "choose a folder you can write to, or fix its permissions"),
    errno.EROFS: ("the filesystem is read-only", "choose another {what} on a writable disk"),
    errno.ENOTDIR: ("a part of the path is a file, not a folder", "choose another {what}"),
    errno.EEXIST: ("a file is in the way", "remove it or choose another {what}"),
    errno.EISDIR: ("a folder is in the way", "remove it or choose another {what}"),
    errno.ENAMETOOLONG: ("the name is too long", "choose a shorter {what}"),
    errno.ENOENT: ("a folder on the way cannot be created", "choose another {what}"),
    errno.EIO: ("an I/O error from the device", "check the disk or choose another {what}"),
}


class WriteError(TformerError, OSError):
    """A write that failed for an OS reason: a TformerError for the CLI (one line, exit 2) and still an
    OSError with its ``errno`` for callers that catch those; ``path`` is where it was going."""

    def __init__(self, message: str, path: Path, code: int | None):
        super().__init__(message)
        self.path, self.errno = path, code  # strerror stays None, so str() is the message alone


def describe_os_error(exc: OSError, what: str = "output path") -> tuple[str, str]:
    """(cause, fix) in words for an OSError."""
    cause, fix = _CAUSES.get(exc.errno, (exc.strerror or str(exc) or type(exc).__name__, "choose another {what}"))
    return cause, fix.format(what=what)


def known_os_error(exc: OSError) -> bool:
    """Whether ``exc`` is an OS fault with a cause and fix in words (a full disk, a permission ...)."""
    return exc.errno in _CAUSES


def os_error_message(exc: OSError) -> str:
    """One line for an OSError: the path it names, the cause in words and the fix."""
    cause, fix = describe_os_error(exc, "path")
    where = f"{exc.filename}: " if exc.filename else ""
    return f"{where}{cause}; {fix}"


def write_error(path: str | Path, exc: OSError, what: str = "output path") -> WriteError:
    cause, fix = describe_os_error(exc, what)
    return WriteError(f"cannot write {path}: {cause}; {fix}", Path(path), exc.errno)


def _as_os_error(exc: BaseException) -> OSError | None:
    """The OSError inside an exception: itself, or a writer library's wrapped I/O error (safetensors
    reports a full disk as SafetensorError('... No space left on device (os error 28)'))."""
    if isinstance(exc, OSError):
        return exc
    if type(exc).__name__ == "SafetensorError":
        found = re.search(r"\(os error (\d+)\)", str(exc))
        if found:
            code = int(found.group(1))
            return OSError(code, os.strerror(code))
    return None


@contextlib.contextmanager
def _writing(final: Path, temporary: Path | None = None, what: str = "output path"):
    """Turn an OS error raised inside into a WriteError naming ``final`` (a file under ``temporary``,
    a staging folder, is named by where it was going)."""
    def staged(path) -> Path | None:
        """Where ``path`` was going, if it lies inside the staging folder ``temporary``; else None."""
        if temporary is None or not path:
            return None
        try:
            inside = Path(path).relative_to(temporary)
        except ValueError:
            return None
        return final / inside if inside.parts else final

    try:
        yield
    except WriteError as exc:
        # Raised by a helper nested inside this one, naming a file in the staging folder: say where it was going.
        named = staged(exc.path)
        if named is None:
            raise
        cause = str(exc).split(": ", 1)[-1]
        raise WriteError(f"cannot write {named}: {cause}", named, exc.errno) from exc
    except TformerError:
        raise
    except Exception as exc:
        os_exc = _as_os_error(exc)
        if os_exc is None:
            raise
        raise write_error(staged(os_exc.filename) or final, os_exc, what) from exc


def _fsync_file(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _fsync_dir(directory: Path) -> None:
    """Make a rename in ``directory`` durable; some systems cannot open a folder, which is harmless."""
    with contextlib.suppress(OSError):
        _fsync_file(directory)


def _fsync_tree(root: Path) -> None:
    for folder, _, files in os.walk(root):
        for name in files:
            _fsync_file(Path(folder) / name)
        _fsync_dir(Path(folder))


def _staging_dir(final: Path) -> Path:
    """A new temporary folder beside ``final``: on the same filesystem, so the last rename is atomic."""
    with _writing(final):
        final.parent.mkdir(parents=True, exist_ok=True)
        return Path(tempfile.mkdtemp(prefix=f".{final.name}.tmp-", dir=final.parent))


@contextlib.contextmanager
def _staged(final: Path, publish):
    """Yield a staging folder beside ``final``; when the body is done, sync it and ``publish(tmp)`` it
    (the rename). Whatever happens, the staging folder is gone afterwards."""
    tmp = None
    try:
        tmp = _staging_dir(final)
        with _writing(final, tmp):
            yield tmp
            _fsync_tree(tmp)
            publish(tmp)
            _fsync_dir(final.parent)
    finally:
        if tmp is not None:
            shutil.rmtree(tmp, ignore_errors=True)


@contextlib.contextmanager
def atomic_dir(final: str | Path):
    """Yield a temporary directory beside ``final``; on success it replaces ``final`` in one rename.

    The old directory is moved aside first and removed last, so at every instant either the old
    or the new complete version exists (readers look for ``.NAME.old`` if NAME is missing).
    """
    final = Path(final)
    old = final.parent / f".{final.name}.old"

    def replace(tmp: Path) -> None:
        if old.exists():
            shutil.rmtree(old)
        moved = final.exists()
        if moved:
            os.replace(final, old)
        try:
            os.replace(tmp, final)
        except OSError:
            if moved:  # put the previous version back under its name
                os.replace(old, final)
            raise

    with _staged(final, replace) as tmp:
        yield tmp
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
    on success it is synced and renamed to ``path``, on failure removed."""
    path = Path(path)
    tmp = None
    try:
        with _writing(path):
            path.parent.mkdir(parents=True, exist_ok=True)
            fd, name = tempfile.mkstemp(prefix=f".{path.name}.tmp-", dir=path.parent)
            os.close(fd)
            tmp = Path(name)
            yield tmp
            _fsync_file(tmp)
            os.chmod(tmp, 0o644)  # mkstemp makes 0600; these are ordinary, shareable files
            os.replace(tmp, path)
            tmp = None
            _fsync_dir(path.parent)
    finally:
        if tmp is not None:
            with contextlib.suppress(OSError):
                os.unlink(tmp)


@contextlib.contextmanager
def atomic_file(path: str | Path, mode: str = "wb"):
    """Yield a file open for writing at a temporary name; on success it is synced and renamed to ``path``."""
    with atomic_path(path) as tmp, _writing(Path(path)), open(tmp, mode) as f:
        yield f
        f.flush()


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
    stage = None
    try:
        with _writing(directory):
            directory.parent.mkdir(parents=True, exist_ok=True)
            stage = Path(tempfile.mkdtemp(prefix=f".{directory.name}.tmp-", dir=directory.parent))
        with _writing(directory, stage):
            yield stage
            missing = [n for n in names if not (stage / n).is_file()]
            if missing:
                # a bug in the caller, not an OS fault: not worded as a write error
                raise RuntimeError(f"atomic_files: the writer left out {', '.join(missing)}")
            _fsync_tree(stage)
            if not directory.exists():
                os.chmod(stage, 0o755)  # mkdtemp makes 0700; a saved model is meant to be shared
                os.rename(stage, directory)
                _fsync_dir(directory.parent)
                return
            for name in names:
                os.replace(stage / name, directory / name)
            _fsync_dir(directory)
    finally:
        if stage is not None:
            shutil.rmtree(stage, ignore_errors=True)


@contextlib.contextmanager
def atomic_new_dir(final: str | Path, marker: str):
    """Yield a temporary directory that becomes ``final`` in one rename, for caches built once.

    Unlike atomic_dir, an existing ``final`` is never replaced: when another process finished the
    same build first (its ``marker`` file is there), its copy is as good as ours and ours is dropped.
    """
    final = Path(final)

    def publish(tmp: Path) -> None:
        try:
            os.rename(tmp, final)
        except OSError:
            if not (final / marker).is_file():
                raise

    with _staged(final, publish) as tmp:
        yield tmp


def make_dir(path: str | Path, what: str = "output folder") -> Path:
    """``mkdir -p`` whose OS error (a file in the way, no permission, a read-only disk) is a WriteError."""
    path = Path(path)
    with _writing(path, what=what):
        path.mkdir(parents=True, exist_ok=True)
    return path


def append_line(path: str | Path, line: str) -> None:
    """Append ``line`` (a newline is added) to a log file as one write, synced.

    A log grows in place, so it cannot be renamed over; instead a failed append (a full disk mid-write)
    cuts the file back to its previous length, so a reader never meets half a line from a failure.
    Only a kill inside the one write() can leave a torn last line: readers skip a last line without
    its newline.
    """
    path = Path(path)
    data = (line.rstrip("\n") + "\n").encode("utf-8")
    with _writing(path):
        fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
        try:
            start = os.fstat(fd).st_size
            try:
                view = memoryview(data)
                while view:
                    view = view[os.write(fd, view):]
                os.fsync(fd)
            except OSError:
                with contextlib.suppress(OSError):
                    os.ftruncate(fd, start)
                raise
        finally:
            os.close(fd)


def complete_lines(text: str) -> list[str]:
    """The non-empty lines of a log written by append_line, less a torn last line (no newline)."""
    lines = text.split("\n")
    return [line for line in lines[:-1] if line.strip()]


def sweep_staging(folder: str | Path) -> list[Path]:
    """Remove what a killed writer left in ``folder``: staging files and folders (``.NAME.tmp-*``) and
    a previous version (``.NAME.old``) whose replacement is in place. Returns what was removed.

    Only for a folder this process owns (a training run under its lock): in a shared folder another
    process's staging folder may be in use.
    """
    removed = []
    folder = Path(folder)
    # the run folder and the folders in it (checkpoint/, tokenizer/, final/): where staging happens
    folders = [folder, *(p for p in folder.iterdir() if p.is_dir() and not p.name.startswith("."))] \
        if folder.is_dir() else []
    for entry in sorted(e for f in folders for e in f.glob(".*")):
        name = entry.name
        stale = ".tmp-" in name or name.startswith(".tformer-probe-") or (
            name.endswith(".old") and (entry.parent / name[1:-len(".old")]).exists())
        if not stale:
            continue
        if entry.is_dir() and not entry.is_symlink():
            shutil.rmtree(entry, ignore_errors=True)
        else:
            with contextlib.suppress(OSError):
                entry.unlink()
        removed.append(entry)
    return removed


def check_output_dir(path: str | Path, what: str = "--out", min_free: int = MIN_FREE_BYTES) -> Path:
    """Refuse, in one line and before any work, an output folder that cannot be written.

    Checks: ``path`` is not a file; no folder above it is a file; the nearest existing folder accepts
    a new entry (a temporary folder is created and removed there, which catches permissions,
    read-only and virtual filesystems even for root); that disk has at least ``min_free`` bytes.
    Nothing is left behind; ``path`` itself is not created.
    """
    path = Path(path).expanduser()
    if path.exists() and not path.is_dir():
        raise TformerError(f"{what} {path} is a file, not a folder; choose another {what}")
    existing = path
    while not existing.exists() and existing != existing.parent:
        existing = existing.parent
    if not existing.is_dir():
        raise TformerError(f"{what} {path}: {existing} is a file, not a folder; choose another {what}")
    try:
        os.rmdir(tempfile.mkdtemp(prefix=".tformer-probe-", dir=existing))
        free = shutil.disk_usage(existing).free
    except OSError as exc:
        cause, fix = describe_os_error(exc, what)
        raise WriteError(f"{what} {path} cannot be written: {cause}; {fix}", path, exc.errno) from None
    if free < min_free:
        raise WriteError(f"{what} {path} cannot be written: no space left on the device ({free} bytes free); "
                         f"free space or choose another {what}", path, errno.ENOSPC)
    return path
