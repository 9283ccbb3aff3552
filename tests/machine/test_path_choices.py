"""The measured choice between computational paths: nearest timing, its gain, and the file beside the profile."""

import pytest

from tformer.core.errors import TformerError
from tformer.machine.path_choices import (
    MIN_GAIN,
    PLAIN,
    PathPoint,
    PathTable,
    load_paths,
    paths_path,
    record_paths,
    save_paths,
)


def point(rows, n, k, gain, threads=2, source="bench"):
    return PathPoint("linear", "split", rows, n, k, threads, "fp32", 1e-3 * gain, 1e-3, source)


def test_the_nearest_measured_shape_decides():
    table = PathTable([point(1, 1024, 1024, 1.8), point(8, 1024, 1024, 0.9), point(1, 1024, 4096, 1.0)])
    assert table.choose("linear", 1, 768, 768, 2, "fp32") == "split"  # near the 1-row point
    assert table.choose("linear", 6, 768, 768, 2, "fp32") == PLAIN  # near the 8-row point, which lost
    assert table.choose("linear", 1, 1024, 3072, 2, "fp32") == PLAIN  # long rows: the BLAS streams them
    assert table.choose("linear", 1, 768, 768, 4, "fp32") == PLAIN  # nothing measured at 4 threads
    assert table.choose("linear", 1, 768, 768, 2, "bf16") == PLAIN
    assert table.choose("other-op", 1, 768, 768, 2, "fp32") == PLAIN


def test_a_gain_within_the_noise_keeps_the_plain_path():
    assert PathTable([point(1, 1024, 1024, MIN_GAIN * 0.99)]).choose("linear", 1, 1024, 1024, 2, "fp32") == PLAIN
    assert PathTable([point(1, 1024, 1024, MIN_GAIN)]).choose("linear", 1, 1024, 1024, 2, "fp32") == "split"


def test_merged_replaces_the_same_shape_and_keeps_the_others():
    table = PathTable([point(1, 1024, 1024, 2.0), point(8, 1024, 1024, 2.0)]).merged([point(1, 1024, 1024, 0.5)])
    assert sorted((p.rows, p.gain) for p in table.points) == [(1, 0.5), (8, 2.0)]


def test_saved_beside_the_profile_and_read_back(monkeypatch, tmp_path):
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    assert load_paths().points == []
    table = PathTable([point(1, 1024, 1024, 1.5, source="first use")])
    path = save_paths(table)
    assert path == paths_path() and path.endswith(".paths.json") and "/tformer/profiles/" in path
    assert load_paths().points == table.points


@pytest.mark.parametrize("content", ['{"version": 1, "points": [{"rows": 1}]}', '{"version": 7, "points": []}',
                                     "[" * 10000, "not json"])
def test_an_unreadable_timings_file_is_one_line_naming_it(monkeypatch, tmp_path, content):
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    path = paths_path()
    save_paths(PathTable())
    with open(path, "w") as f:
        f.write(content)
    with pytest.raises(TformerError) as exc:
        load_paths()
    assert path in str(exc.value) and "\n" not in str(exc.value)


def test_a_damaged_timings_file_is_a_cache_when_the_caller_says_so_and_recording_replaces_it(monkeypatch, tmp_path):
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    save_paths(PathTable())
    with open(paths_path(), "w") as f:
        f.write("not json")
    notes = []
    assert load_paths(on_damage=notes.append).points == []
    assert len(notes) == 1 and paths_path() in notes[0]
    table = record_paths([point(1, 1024, 1024, 1.5), point(8, 1024, 1024, 0.9)], on_damage=notes.append)
    record_paths([point(1, 1024, 1024, 0.7)])  # the same shape measured again replaces the old timing
    assert sorted((p.rows, p.gain) for p in load_paths().points) == [(1, 0.7), (8, 0.9)]
    assert len(table.points) == 2 and len(notes) == 2
