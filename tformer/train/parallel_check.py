"""The ledger's layouts beside a real torchrun: launch tformer.train.parallel_probe on N CPU processes
over gloo, then set what rank 0 held and sent beside tformer.cost.parallel's prediction.

Bytes sent per step by rank 0: DDP's all-reduce 2 (N - 1) / N x the payload its communication hook
counts; FSDP2's reduce-scatter and all-gather (N - 1) / N x the payloads it hands to torch.distributed.
Time: the N-process step beside step_time's prediction from the single-process step and the traffic
over the measured loopback link (the bytes at its all-reduce bandwidth, each collective call at its
latency); the scaling efficiency is the single step over the N-process step (each replica has the
same batch, so a perfect run keeps the step time).
"""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import tempfile
from pathlib import Path

from tformer.core.errors import TformerError
from tformer.core.files import read_json
from tformer.cost.layout import Layout
from tformer.cost.parallel import communication, per_device, ring_all_reduce_bytes, step_time
from tformer.cost.workload import Workload
from tformer.machine import usable_cpus

PROBE = "tformer.train.parallel_probe"
ROOT = Path(__file__).resolve().parents[2]  # so the ranks import this tformer, installed or not
TIMEOUT_S = 600
# probe's counter -> (ledger's communication kind, bytes one rank sends in a ring for a payload on N ranks)
TRAFFIC = {"all_reduce": ("data_parallel_all_reduce", ring_all_reduce_bytes),
           "reduce_scatter": ("zero_reduce_scatter", lambda payload, n: (n - 1) / n * payload),
           "all_gather": ("zero_all_gather", lambda payload, n: (n - 1) / n * payload)}


def can_run(nproc: int) -> tuple[bool, str]:
    """Whether an N-process gloo run makes sense here, and why not."""
    if nproc < 2:
        return False, f"a data-parallel run needs at least 2 processes, got {nproc}"
    cpus = usable_cpus()
    if cpus < nproc:
        return False, f"{nproc} processes need {nproc} CPUs (one each) and this process may use {cpus}"
    # deferred: torch.distributed is only asked about when a run is wanted
    import torch.distributed as dist

    if not (dist.is_available() and dist.is_gloo_available()):
        return False, "this PyTorch build has no torch.distributed gloo backend"
    return True, ""


def run_probe(config, nproc: int, batch: int, seq: int, warmup: int = 2, steps: int = 5,
              layouts: str | None = None, timeout_s: float = TIMEOUT_S) -> dict:
    """The probe's JSON from ``nproc`` ranks under torchrun (``batch`` sequences per rank)."""
    ok, why = can_run(nproc)
    if not ok:
        raise TformerError(f"cannot measure a {nproc}-process run: {why}")
    with tempfile.TemporaryDirectory(prefix="tformer-parallel-") as tmp:
        cfg, out = Path(tmp) / "config.json", Path(tmp) / "measured.json"
        cfg.write_text(json.dumps(config.to_dict()), encoding="utf-8")
        args = ["--config", str(cfg), "--batch", str(batch), "--seq", str(seq), "--warmup", str(warmup),
                "--steps", str(steps), "--out", str(out)] + (["--layouts", layouts] if layouts else [])
        launch = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", str(nproc),
                  "-m", PROBE]
        env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")])),
               "OMP_NUM_THREADS": "1"}
        code, output = _launch(launch + args, env, timeout_s)
        if code is None:
            raise TformerError(f"the {nproc}-process run did not finish in {timeout_s:g} s; "
                               "lower the batch or the steps")
        if code != 0 or not out.is_file():
            raise TformerError(f"the {nproc}-process run failed (exit {code}): {first_rank_error(output)}")
        return read_json(out, "parallel probe output", fix="rerun it")


def _launch(cmd: list[str], env: dict, timeout_s: float) -> tuple[int | None, str]:
    """(exit code or None on timeout, stderr) of torchrun and its ranks, run in a process group of their
    own: on a timeout, Ctrl-C or any error here the whole group is stopped, so no rank outlives us."""
    proc = subprocess.Popen(cmd, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
                            start_new_session=True)
    try:
        _, err = proc.communicate(timeout=timeout_s)
        return proc.returncode, err
    except subprocess.TimeoutExpired:
        _stop_group(proc)
        return None, ""
    except BaseException:
        _stop_group(proc)
        raise


def _stop_group(proc: subprocess.Popen) -> None:
    for sig, wait_s in ((signal.SIGTERM, 5.0), (signal.SIGKILL, 5.0)):
        try:
            os.killpg(proc.pid, sig)
        except ProcessLookupError:
            return
        try:
            proc.wait(timeout=wait_s)
            return
        except subprocess.TimeoutExpired:
            continue


def first_rank_error(text: str) -> str:
    """The first exception a rank raised (torchrun's own report of the failure follows it)."""
    for line in text.splitlines():
        found = re.match(r"(?:\[rank\d+\]:)?\s*([\w.]+(?:Error|Exception)): (.+)", line)
        if found and not found.group(1).endswith("ChildFailedError"):
            return f"{found.group(1).rsplit('.', 1)[-1]}: {found.group(2)}"
    lines = [line for line in text.strip().splitlines() if line.strip()]
    return lines[-1] if lines else "no output"


def workload(batch: int, seq: int) -> Workload:
    """What each replica runs: fp32 AdamW on ``batch`` sequences of ``seq`` tokens."""
    return Workload(phase="train", batch=batch, seq=seq, dtype="fp32", optimizer="adamw")


def compare(config, measured: dict) -> list[dict]:
    """Per layout and kind: rank 0's measured bytes beside the ledger's, and their ratio (and for the
    traffic, the collective calls beside the ledger's)."""
    n, w = measured["world"], workload(measured["batch"], measured["seq"])
    rows = []
    for m in measured["layouts"]:
        layout = Layout(devices=n, zero=m["zero"])
        mem, comm = per_device(config, w, layout), communication(config, w, layout)
        for kind in ("weights", "gradients", "optimizer"):
            rows.append({"layout": m["layout"], "kind": kind, "measured": m[kind], "predicted": mem[kind]})
        for counter, payload in m["collectives"].items():
            ledger_kind, sent = TRAFFIC[counter]
            rows.append({"layout": m["layout"], "kind": ledger_kind, "measured": round(sent(payload, n)),
                         "predicted": comm["bytes"].get(ledger_kind, 0), "payload": payload,
                         "calls": m["calls"][counter], "predicted_calls": comm["calls"].get(ledger_kind, 0)})
    for r in rows:
        r["ratio"] = r["measured"] / r["predicted"] if r["predicted"] else None
    return rows


def timing(config, measured: dict) -> list[dict]:
    """Per layout: the measured N-process step beside step_time's prediction over the loopback link."""
    n, bw, latency = measured["world"], measured["loopback"]["bus_bytes_per_s"], measured["loopback"]["latency_s"]
    single_s = measured["single"]["step_s"]
    w = workload(measured["batch"], measured["seq"])
    out = []
    for m in measured["layouts"]:
        layout = Layout(devices=n, zero=m["zero"])
        comm_s = communication(config, w, layout, bw, link_latency=latency)["seconds"]
        p = step_time(single_s, comm_s, layout)
        out.append({"layout": m["layout"], "measured_s": m["step_s"], "comm_s": comm_s,
                    "overlapped_s": p["overlapped_s"], "serial_s": p["serial_s"],
                    "efficiency": single_s / m["step_s"], "efficiency_overlapped": single_s / p["overlapped_s"],
                    "efficiency_serial": single_s / p["serial_s"]})
    return out


__all__ = ["can_run", "compare", "first_rank_error", "run_probe", "timing", "workload"]
