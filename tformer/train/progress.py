"""A live progress bar for training on a terminal; plain log lines everywhere else.

On a TTY, rank 0 shows one rich bar (step, loss, tokens/s, MFU, elapsed, ETA) redrawn every step,
with log messages (eval results, samples, checkpoints) printed above it. Without a TTY (CI, pipes,
files) nothing changes: every message is a plain ``print`` line, as before, so logs stay greppable.
"""

from __future__ import annotations

import sys


class TrainProgress:
    """Pass ``enabled=None`` to decide by whether stderr is a terminal; ``force_terminal`` is for tests."""

    def __init__(self, enabled: bool | None = None, file=None, force_terminal: bool = False):
        stream = file if file is not None else sys.stderr
        if enabled is None:
            enabled = force_terminal or _isatty(stream)
        self.enabled = enabled
        self._file, self._force = stream, force_terminal
        self._bar = self._task = None
        self._tps = None  # smoothed tokens/s, so the number does not flicker step to step

    @property
    def live(self) -> bool:
        return self._bar is not None

    def print(self, message: str) -> None:
        """One log line: above the bar while it is shown, else a plain flushed print to stdout."""
        if self._bar is not None:
            # markup/highlight off: messages are plain text (samples may contain "[" and such).
            self._bar.console.print(message, markup=False, highlight=False)
        else:
            print(message, flush=True)

    def start(self, total: int, completed: int) -> None:
        if not self.enabled or self._bar is not None:
            return
        # deferred: rich loads only when something is printed with it
        from rich.console import Console
        from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn

        console = Console(file=self._file, force_terminal=self._force or None)
        self._bar = Progress(TextColumn("step"), MofNCompleteColumn(), BarColumn(), TextColumn("{task.fields[stats]}"),
                             console=console, transient=False)
        self._task = self._bar.add_task("train", total=total, completed=completed, stats="")
        self._bar.start()

    def update(self, step: int, total: int, loss: float, tokens_per_s: float, elapsed: float,
               budget: float | None, mfu: float | None = None) -> None:
        if self._bar is None:
            return
        self._tps = tokens_per_s if self._tps is None else 0.9 * self._tps + 0.1 * tokens_per_s
        parts = [f"loss {loss:.4f}", f"{self._tps:,.0f} tok/s"]
        if mfu is not None:
            parts.append(f"MFU {100 * mfu:.1f}%")
        parts.append(f"{_clock(elapsed)} elapsed, ETA {_clock(eta(step, total, elapsed, budget))}")
        self._bar.update(self._task, completed=step, stats=" | ".join(parts))

    def stop(self) -> None:
        if self._bar is not None:
            self._bar.stop()
            self._bar = self._task = None


def eta(step: int, total: int, elapsed: float, budget: float | None) -> float:
    """Seconds left at the average pace so far, capped by what remains of --time-budget."""
    left = (total - step) * elapsed / max(step, 1)
    if budget is not None:
        left = min(left, max(budget - elapsed, 0))
    return left


def _clock(seconds: float) -> str:
    s = int(seconds)
    return f"{s // 3600}:{s % 3600 // 60:02d}:{s % 60:02d}"


def _isatty(stream) -> bool:
    try:
        return stream.isatty()
    except (AttributeError, ValueError):
        return False
