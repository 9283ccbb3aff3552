"""`tformer ARGV` in a process of its own, forked from a server that has already imported torch and every
command, for tests about what a command does (its exit status, its output, the files it leaves) rather
than about interpreter start-up. Not a test module itself.

A fresh `python -m tformer` pays for the interpreter and `import torch` (2-5 s on a small CPU) before the
command starts; a fork of the server starts with both loaded. The server is a fresh interpreter started
once per test session, not the test process: it never runs a torch operation, so each child starts its
own OpenMP threads (a child forked after its parent used them hangs in its first parallel region), and
nothing pytest changes in its own process (warning capture, logging, seeds) reaches the command. Each
child gets its own exit status, file descriptors 0-2, working directory and environment.
What stays with `subprocess`: tests of start-up itself (import trace, `-m` handling), signals and pipes.

Run as a script, this file is the server: one JSON request per line on stdin, one JSON answer per line
on stdout.
"""

from __future__ import annotations

import atexit
import json
import os
import signal
import subprocess
import sys
import tempfile
import time
import traceback
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
POLL_S = 0.005
_server: subprocess.Popen | None = None


def run_tformer(argv: list, *, cwd: str | Path | None = None, env: dict[str, str] | None = None,
                timeout: float = 300, stdin: bytes | None = None) -> subprocess.CompletedProcess:
    """What subprocess.run([python, -m, tformer, *ARGV], capture_output=True, text=True, stdin=DEVNULL)
    returns, from a forked child; ``env`` None means this process's environment; ``stdin`` bytes are what the
    command reads on its standard input (None: /dev/null). Raises subprocess.TimeoutExpired (after killing
    the child) past ``timeout`` seconds."""
    argv = [str(a) for a in argv]
    fd_out, out_path = tempfile.mkstemp(prefix="tformer-out-")
    fd_err, err_path = tempfile.mkstemp(prefix="tformer-err-")
    os.close(fd_out)
    os.close(fd_err)
    in_path = None
    if stdin is not None:
        fd_in, in_path = tempfile.mkstemp(prefix="tformer-in-")
        with os.fdopen(fd_in, "wb") as fh:
            fh.write(stdin)
    try:
        request = {"argv": argv, "cwd": str(cwd or os.getcwd()), "env": dict(os.environ if env is None else env),
                   "in": in_path or os.devnull, "out": out_path, "err": err_path, "timeout": timeout}
        answer = _ask(request)
        stdout = Path(out_path).read_text(errors="replace")
        stderr = Path(err_path).read_text(errors="replace")
    finally:
        os.unlink(out_path)
        os.unlink(err_path)
        if in_path is not None:
            os.unlink(in_path)
    cmd = [sys.executable, "-m", "tformer", *argv]
    if answer["timeout"]:
        raise subprocess.TimeoutExpired(cmd, timeout, stdout, stderr)
    return subprocess.CompletedProcess(cmd, answer["code"], stdout, stderr)


def _ask(request: dict) -> dict:
    global _server
    if _server is None or _server.poll() is not None:
        env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(REPO), os.environ.get("PYTHONPATH")]))}
        _server = subprocess.Popen([sys.executable, __file__], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                   env=env, text=True)
        atexit.register(_server.kill)
    _server.stdin.write(json.dumps(request) + "\n")
    _server.stdin.flush()
    line = _server.stdout.readline()
    if not line:
        raise RuntimeError(f"the tformer fork server exited with status {_server.wait()}")
    return json.loads(line)


def _serve() -> None:
    import torch  # noqa: F401  deferred: only the server loads torch up front, for its children

    import tformer.cli

    tformer.cli.build_parser()  # every command module, loaded once before the first fork
    answers = sys.stdout
    for line in sys.stdin:
        request = json.loads(line)
        pid = os.fork()
        if pid == 0:
            _child(tformer.cli.main, request)
        status = _wait(pid, request["timeout"])
        answers.write(json.dumps({"timeout": status is None,
                                  "code": None if status is None else os.waitstatus_to_exitcode(status)}) + "\n")
        answers.flush()


def _wait(pid: int, timeout: float) -> int | None:
    deadline = time.monotonic() + timeout
    while True:
        done, status = os.waitpid(pid, os.WNOHANG)
        if done:
            return status
        if time.monotonic() > deadline:
            os.kill(pid, signal.SIGKILL)
            os.waitpid(pid, 0)
            return None
        time.sleep(POLL_S)


def _child(main, request: dict) -> None:
    code = 1
    try:
        os.chdir(request["cwd"])
        os.environ.clear()
        os.environ.update(request["env"])
        os.dup2(os.open(request.get("in", os.devnull), os.O_RDONLY), 0)
        os.dup2(os.open(request["out"], os.O_WRONLY | os.O_TRUNC), 1)
        os.dup2(os.open(request["err"], os.O_WRONLY | os.O_TRUNC), 2)
        # The child's standard streams for its whole life: os._exit ends it, never a with-block.
        sys.stdin = open(0, closefd=False)  # noqa: SIM115
        sys.stdout = open(1, "w", closefd=False)  # noqa: SIM115
        sys.stderr = open(2, "w", closefd=False)  # noqa: SIM115
        sys.argv = [str(REPO / "tformer" / "__main__.py"), *request["argv"]]
        sys.dont_write_bytecode = True
        _thread_count_from(request["env"])
        code = _exit_code(main, request["argv"])
    except BaseException:  # noqa: BLE001  as the interpreter does: any escape is a traceback and status 1
        traceback.print_exc()
    finally:
        try:
            sys.stdout.flush()
            sys.stderr.flush()
        finally:
            os._exit(code)


def _thread_count_from(env: dict[str, str]) -> None:
    """OMP_NUM_THREADS as a fresh process reads it when torch loads (the server loaded torch before this
    request's environment existed)."""
    if env.get("OMP_NUM_THREADS", "").isdigit() and int(env["OMP_NUM_THREADS"]) > 0:
        import torch  # deferred: already loaded by the server; only the child needs the name

        torch.set_num_threads(int(env["OMP_NUM_THREADS"]))


def _exit_code(main, argv: list[str]) -> int:
    """main's result as the interpreter turns it into an exit status (SystemExit's rules); an uncaught
    exception prints its traceback and exits 1, as `python -m` does."""
    try:
        result = main(argv)
    except SystemExit as exc:
        result = exc.code
    if result is None:
        return 0
    if isinstance(result, int):
        return result & 0xFF
    print(result, file=sys.stderr)
    return 1


if __name__ == "__main__":
    _serve()
