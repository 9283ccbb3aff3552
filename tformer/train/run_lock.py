"""One writer per run: an exclusive lock on a training run's output folder for the run's whole life.

The lock is ``RUN/.lock``, held with ``flock`` on an open file and naming its owner (pid and host).
The OS drops a flock when its process dies, however it dies, so a lock file that nobody holds is
stale by construction: a SIGKILLed trainer's file is taken over (with a note) by the next one.
The new owner removes what a killed writer left unfinished (staging folders of a checkpoint write).
A lock file naming another host is never taken over on our own say-so: that host may still be
training into a shared filesystem, so the refusal says which file to delete once it is not.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import socket
from collections.abc import Callable
from pathlib import Path

from tformer.core.atomic import sweep_staging
from tformer.core.errors import TformerError

LOCK_NAME = ".lock"

__all__ = ["LOCK_NAME", "RunLock", "run_lock"]


class RunLock:
    """An acquired lock; ``release()`` (idempotent) gives it back and removes the file."""

    def __init__(self, path: Path, fd: int, created_dir: Path | None):
        self.path, self._fd, self._created_dir = path, fd, created_dir

    def release(self) -> None:
        if self._fd < 0:
            return
        # Unlink while still holding the lock: a process waiting on this inode then sees it is gone (acquire
        # checks that the path still names the inode it locked) instead of owning a file nobody can find.
        with contextlib.suppress(OSError):
            os.unlink(self.path)
        os.close(self._fd)
        self._fd = -1
        if self._created_dir is not None:
            with contextlib.suppress(OSError):  # only if still empty: a refused run leaves no folder behind
                self._created_dir.rmdir()


def _owner(text: str) -> tuple[int | None, str]:
    """(pid, host) from a lock file's text ``pid=N host=H``; (None, '') when unreadable."""
    fields = dict(part.split("=", 1) for part in text.split() if "=" in part)
    try:
        return int(fields.get("pid", "")), fields.get("host", "")
    except ValueError:
        return None, fields.get("host", "")


def acquire(folder: str | Path, note: Callable[[str], None] = print) -> RunLock:
    """Lock ``folder`` (created if missing) for this process, or raise a TformerError naming the owner."""
    folder = Path(folder)
    created = None if folder.exists() else folder
    try:
        folder.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise TformerError(f"cannot create the run folder {folder} ({exc.strerror}); choose another --out") from None
    path = folder / LOCK_NAME
    host = socket.gethostname()
    while True:
        try:
            fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
        except OSError as exc:
            raise TformerError(f"cannot create the lock file {path} ({exc.strerror}); choose another --out") from None
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            pid, owner_host = _owner(os.pread(fd, 256, 0).decode("utf-8", "replace"))
            os.close(fd)
            who = f"pid {pid}" if pid is not None else "another process"
            raise TformerError(f"{folder} is being trained by {who}{' on ' + owner_host if owner_host else ''} "
                               f"(lock {path}); wait for it to finish or choose another --out") from None
        except OSError:
            os.close(fd)
            raise
        try:
            if os.stat(path).st_ino == os.fstat(fd).st_ino:
                break
        except FileNotFoundError:
            pass
        os.close(fd)  # the owner removed the file between our open and flock: lock the new one
    old_pid, old_host = _owner(os.pread(fd, 256, 0).decode("utf-8", "replace"))
    if old_pid is not None and old_host and old_host != host:
        os.close(fd)
        raise TformerError(f"{folder} is locked by pid {old_pid} on host {old_host} (lock {path}); if that "
                           f"run has ended, delete {path} and start again")
    if old_pid is not None:
        note(f"note: taking over a stale lock on {folder} (pid {old_pid} is no longer training)")
    os.ftruncate(fd, 0)
    os.pwrite(fd, f"pid={os.getpid()} host={host}\n".encode(), 0)
    # Now that nobody else writes here: what a killed writer left half-made is garbage, never a
    # checkpoint (those appear by rename only when complete).
    leftovers = sweep_staging(folder)
    if leftovers:
        note(f"note: removed {len(leftovers)} unfinished write(s) left by an interrupted run in {folder} "
             f"({', '.join(p.name for p in leftovers[:3])}{', ...' if len(leftovers) > 3 else ''})")
    return RunLock(path, fd, created)


@contextlib.contextmanager
def run_lock(folder: str | Path, note: Callable[[str], None] = print, enabled: bool = True):
    """Hold the lock on ``folder`` for the body; ``enabled=False`` (torchrun ranks other than 0) is a no-op."""
    lock = acquire(folder, note) if enabled else None
    try:
        yield lock
    finally:
        if lock is not None:
            lock.release()
