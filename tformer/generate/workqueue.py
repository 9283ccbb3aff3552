"""A bounded queue served by one worker thread: what the serving loops share (ContinuousBatcher for
completions, tformer.serve's EmbeddingBatcher). The queue refuses work once full (QueueFull: HTTP 429)
or once shutting down (Closed: HTTP 503); ``shutdown`` asks the loop to finish and joins the thread.
A subclass writes ``_loop`` (it waits on ``_cond`` for ``_pending`` or ``_closing``) and what it queues.
"""

from __future__ import annotations

import threading
from collections import deque

from tformer.core.errors import TformerError


class QueueFull(TformerError):
    """The waiting queue holds max_queue requests; the client should retry later (HTTP 429)."""


class Closed(TformerError):
    """The worker is shutting down and takes no new requests (HTTP 503)."""


class WorkQueue:
    def __init__(self, max_queue: int, name: str):
        if isinstance(max_queue, bool) or not isinstance(max_queue, int) or max_queue < 1:
            raise TformerError(f"max_queue must be a whole number >= 1, got {max_queue!r}")
        self.max_queue, self._name = max_queue, name
        self._cond = threading.Condition()  # guards _pending and _closing; notified on every change
        self._pending: deque = deque()
        self._closing = False
        self._drain = True
        self._thread: threading.Thread | None = None

    @property
    def queue_depth(self) -> int:
        return len(self._pending)

    @property
    def running(self) -> bool:
        return self._thread is not None and self._thread.is_alive()

    def start(self):
        self._thread = threading.Thread(target=self._loop, name=self._name, daemon=True)
        self._thread.start()
        return self

    def _enqueue(self, item) -> None:
        with self._cond:
            if self._closing:
                raise Closed("the server is shutting down; send the request to another instance or retry later")
            if len(self._pending) >= self.max_queue:
                raise QueueFull(f"{len(self._pending)} requests are already waiting (max_queue {self.max_queue}); "
                                "retry later")
            self._pending.append(item)
            self._cond.notify()

    def shutdown(self, drain: bool = True, timeout: float | None = None) -> bool:
        """Stop taking requests; the loop finishes what is queued and running (``drain``) or refuses it. Returns
        whether the loop has ended within ``timeout`` seconds."""
        with self._cond:
            self._closing, self._drain = True, drain
            self._cond.notify()
        if self._thread is not None:
            self._thread.join(timeout)
            return not self._thread.is_alive()
        return True

    def _loop(self) -> None:
        raise NotImplementedError


__all__ = ["Closed", "QueueFull", "WorkQueue"]
