"""One writer per run: the lock on a run folder, its stale-lock takeover, and its refusals."""

import os
import socket
import subprocess
import sys

import pytest

from tformer.core.errors import TformerError
from tformer.train.run_lock import LOCK_NAME, acquire, run_lock


def _dead_pid() -> int:
    child = subprocess.Popen([sys.executable, "-c", "pass"])
    child.wait()
    return child.pid


def test_lock_names_its_owner_and_refuses_a_second_holder(tmp_path):
    with run_lock(tmp_path / "run") as lock:
        assert lock.path.read_text() == f"pid={os.getpid()} host={socket.gethostname()}\n"
        with pytest.raises(TformerError, match=f"being trained by pid {os.getpid()} on "):
            acquire(tmp_path / "run")  # a second open file: flock conflicts even within one process
    assert not (tmp_path / "run").exists()  # created for the lock, empty again: removed on release


def test_release_keeps_a_folder_that_has_files(tmp_path):
    with run_lock(tmp_path):
        (tmp_path / "metrics.jsonl").write_text("{}\n")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["metrics.jsonl"]


def test_stale_lock_of_a_dead_process_is_taken_over_with_a_note(tmp_path):
    pid = _dead_pid()
    (tmp_path / LOCK_NAME).write_text(f"pid={pid} host={socket.gethostname()}\n")
    notes = []
    with run_lock(tmp_path, note=notes.append) as lock:
        assert lock.path.read_text().startswith(f"pid={os.getpid()} ")
    assert len(notes) == 1 and "stale lock" in notes[0] and str(pid) in notes[0]
    assert not (tmp_path / LOCK_NAME).exists()


def test_the_new_owner_clears_a_half_written_checkpoint_and_keeps_the_whole_one(tmp_path):
    (tmp_path / "checkpoint").mkdir()
    (tmp_path / "checkpoint" / "state.json").write_text("{}")
    (tmp_path / ".checkpoint.tmp-k1ll3d").mkdir()  # what SIGKILL inside a checkpoint write leaves
    (tmp_path / ".checkpoint.tmp-k1ll3d" / "model.safetensors").write_bytes(b"half")
    notes = []
    with run_lock(tmp_path, note=notes.append):
        assert sorted(p.name for p in tmp_path.iterdir()) == [LOCK_NAME, "checkpoint"]
    assert len(notes) == 1 and "unfinished write" in notes[0] and ".checkpoint.tmp-k1ll3d" in notes[0]
    assert (tmp_path / "checkpoint" / "state.json").read_text() == "{}"


def test_lock_of_another_host_is_not_taken_over(tmp_path):
    (tmp_path / LOCK_NAME).write_text("pid=4242 host=some-other-node\n")
    with pytest.raises(TformerError, match="pid 4242 on host some-other-node.*delete"):
        acquire(tmp_path)
    assert (tmp_path / LOCK_NAME).read_text() == "pid=4242 host=some-other-node\n"


def test_lock_held_by_another_process_is_refused_and_left_alone(tmp_path):
    code = ("import sys, time; from tformer.train.run_lock import acquire; acquire(sys.argv[1]); "
            "print('locked', flush=True); time.sleep(60)")
    holder = subprocess.Popen([sys.executable, "-c", code, str(tmp_path)], stdout=subprocess.PIPE, text=True,
                              env={**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)})
    try:
        assert holder.stdout.readline().strip() == "locked"
        with pytest.raises(TformerError, match=f"pid {holder.pid} "):
            acquire(tmp_path)
        assert (tmp_path / LOCK_NAME).read_text().startswith(f"pid={holder.pid} ")
    finally:
        holder.kill()
        holder.wait()
    with run_lock(tmp_path, note=lambda _: None):  # the OS dropped the dead holder's flock
        pass


def test_disabled_lock_is_a_no_op(tmp_path):
    with run_lock(tmp_path / "run", enabled=False) as lock:
        assert lock is None
    assert not (tmp_path / "run").exists()
