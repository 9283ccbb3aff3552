"""`tformer serve`: bad arguments and a port in use are one line and exit 2; SIGTERM lets a streaming
request finish, then the process exits 0."""

from __future__ import annotations

import json
import os
import re
import signal
import socket
import subprocess
import sys
from pathlib import Path

import httpx
import pytest

from tformer.cli import main
from tformer.generate.batching_report import prediction_device
from tformer.serve import is_loopback

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.parametrize("flags,needle", [
    (["--max-batch", "0"], "--max-batch"), (["--max-queue", "-1"], "--max-queue"),
    (["--port", "70000"], "--port"), (["--request-timeout", "0"], "--request-timeout"),
    (["--batch-window-ms", "-5"], "--batch-window-ms"), (["--api-key", " "], "--api-key"),
    (["--max-body-bytes", "0"], "--max-body-bytes"),
])
def test_bad_arguments_exit_2_with_one_line(checkpoints, capsys, flags, needle):
    assert main(["serve", "--ckpt", str(checkpoints["ids"]), *flags]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and needle in err


def test_port_in_use_exits_2(checkpoints, capsys):
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen(1)
        port = taken.getsockname()[1]
        assert main(["serve", "--ckpt", str(checkpoints["ids"]), "--port", str(port)]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "already in use" in err


def test_loopback_hosts():
    assert is_loopback("127.0.0.1") and is_loopback("localhost") and is_loopback("::1")
    assert not is_loopback("0.0.0.0")


def test_sigterm_drains_a_streaming_request_then_exits_0(checkpoints):
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")]))}
    command = [sys.executable, "-m", "tformer", "serve", "--ckpt", str(checkpoints["long"]), "--port", "0", "--report"]
    proc = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env, cwd=ROOT)
    try:
        banner = proc.stdout.readline()
        port = int(re.search(r"http://127\.0\.0\.1:(\d+)", banner).group(1))
        body = {"prompt": [1, 2], "max_tokens": 300, "temperature": 0, "stop_token_ids": [], "stream": True}
        chunks = []
        with httpx.stream("POST", f"http://127.0.0.1:{port}/v1/completions", json=body, timeout=60) as r:
            lines = r.iter_lines()
            for line in lines:
                if line:
                    chunks.append(line)
                    break
            proc.send_signal(signal.SIGTERM)
            chunks += [line for line in lines if line]
        assert proc.wait(timeout=60) == 0, proc.stderr.read()[-2000:]
        report = proc.stdout.read()
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert chunks[-1] == "data: [DONE]"
    final = json.loads(chunks[-2][len("data: "):])
    assert final["choices"][0]["finish_reason"] == "length"
    assert final["usage"]["completion_tokens"] == 300
    # --report: the 299 decode steps at batch 1, measured beside the ledger's prediction
    assert "sequences ended: length 1; 300 tokens generated" in report
    row = next(line.split() for line in report.splitlines() if line.split()[:2] == ["1", "299"])
    device = prediction_device()  # what the server predicts for: this machine's profile, else its theoretical roofs
    assert row[-1] == ("1.00x" if device.bandwidth and device.peak("fp32") else "unknown")
