"""Ctrl-C and SIGTERM during training: finish the step, checkpoint, stop; a second one stops at once.

The handler only records the signal (printing from a signal handler can re-enter a half-done print);
the training loop looks at ``trainer.stop_signal`` after each step. After the first signal the default
handlers come back, so a second Ctrl-C raises KeyboardInterrupt wherever the program is and a second
SIGTERM ends the process: the checkpoint being written then is abandoned (its temporary folder, or
nothing), and the last complete one stays where it was.
"""

from __future__ import annotations

import contextlib
import shlex
import signal
from pathlib import Path

STOP_SIGNALS = (signal.SIGINT, signal.SIGTERM)

__all__ = ["STOP_SIGNALS", "exit_code", "stop_on_signals", "stopped_line"]


def exit_code(signum: int) -> int:
    """The shell's convention for a process ended by ``signum``: 130 for SIGINT, 143 for SIGTERM."""
    return 128 + int(signum)


def stopped_line(result: dict, out: Path, command: str) -> str:
    """What a command prints when a signal stopped its run: the signal, the step, where the checkpoint is, and the
    command line (``command``, e.g. "tformer train") that resumes it."""
    return (f"stopped by {signal.Signals(result['stopped_by']).name} after step {result['step']}; checkpoint in "
            f"{out / 'checkpoint'}; resume with: {command} --resume --out {shlex.quote(str(out))}")


@contextlib.contextmanager
def stop_on_signals(trainer):
    """For the body, SIGINT/SIGTERM set ``trainer.stop_signal`` instead of ending the process (main thread only)."""

    def first(signum, _frame):
        trainer.stop_signal = signum
        signal.signal(signal.SIGINT, signal.default_int_handler)
        signal.signal(signal.SIGTERM, signal.SIG_DFL)

    previous = {s: signal.signal(s, first) for s in STOP_SIGNALS}
    try:
        yield
    finally:
        for s, handler in previous.items():
            signal.signal(s, handler)
