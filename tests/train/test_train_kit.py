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
