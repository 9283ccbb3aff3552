"""The test kit's process runner: a process the run started in a session of its own (as torchrun starts its ranks)
that outlives the run is killed, and does not keep the runner waiting on its output."""

import os
import re
import sys
import time
from pathlib import Path

import pytest

from train_kit import _run_group

ORPHAN = """
import subprocess, sys
child = subprocess.Popen([sys.executable, "-c", "import time; print('child', flush=True); time.sleep(120)"],
                         start_new_session=True)
print(f"pid={child.pid}", flush=True)
"""


@pytest.mark.skipif(not Path("/proc/self/environ").exists(), reason="finds the run's processes through /proc")
def test_an_orphan_in_its_own_session_neither_blocks_nor_survives():
    start = time.monotonic()
    done = _run_group([sys.executable, "-c", ORPHAN], dict(os.environ), timeout_s=60)
    assert done is not None and done.returncode == 0 and time.monotonic() - start < 30
    pid = int(re.search(r"pid=(\d+)", done.stdout).group(1))
    for _ in range(50):  # SIGKILL is delivered at once; the zombie is reaped by init shortly after
        if not Path(f"/proc/{pid}").exists() or "Z" in Path(f"/proc/{pid}/stat").read_text().split()[2]:
            break
        time.sleep(0.1)
    else:
        raise AssertionError(f"the orphan {pid} is still running")


def test_a_collective_s_tensor_outlives_its_caller(tmp_path):
    """What keeps a two-rank run from hanging at exit (tformer/train/distributed.py): the tensor a collective reduced
    is still referenced after the caller dropped it, so gloo's worker never releases a Python object (which needs
    the GIL the group's destructor holds while joining the worker)."""
    import weakref

    import torch
    import torch.distributed as dist

    from tformer.train import distributed

    dist.init_process_group("gloo", init_method=f"file://{tmp_path / 'store'}", rank=0, world_size=1)
    try:
        t = torch.ones(3)
        alive = weakref.ref(t)
        distributed._all_reduce(t, dist.ReduceOp.SUM)
        del t
        assert alive() is not None
        for _ in range(distributed.HELD):
            distributed._all_reduce(torch.ones(1), dist.ReduceOp.SUM)
        assert alive() is None  # bounded: only the latest are held
    finally:
        distributed.shutdown()
    assert not dist.is_initialized()
