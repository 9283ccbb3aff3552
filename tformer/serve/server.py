"""Running the app under uvicorn: bind first (a port in use is one line, not a traceback), then serve
until SIGTERM/SIGINT, when uvicorn lets in-flight requests finish and the app's lifespan drains the batcher."""

from __future__ import annotations

import errno
import signal
import socket
import threading

import uvicorn

from tformer.core.errors import TformerError


def bind(host: str, port: int) -> socket.socket:
    """A listening socket on host:port (port 0: any free port; read it from getsockname())."""
    try:
        infos = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)
    except socket.gaierror as exc:
        raise TformerError(f"cannot resolve --host {host!r} ({exc.strerror}); pass an address such as 127.0.0.1")
    family, _, _, _, address = infos[0]
    sock = socket.socket(family, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        sock.bind(address)
        sock.listen(2048)
    except OSError as exc:
        sock.close()
        if exc.errno == errno.EADDRINUSE:
            raise TformerError(f"port {port} on {host} is already in use; stop the other server or pass --port N")
        raise TformerError(f"cannot listen on {host}:{port} ({exc.strerror}); pick another --host or --port")
    sock.set_inheritable(True)
    return sock


def make_server(app, log_level: str = "warning") -> uvicorn.Server:
    """A uvicorn server for ``app``; start it with ``run(server, bind(host, port))``."""
    config = uvicorn.Config(app, log_level=log_level, access_log=False, lifespan="on", timeout_keep_alive=5)
    return uvicorn.Server(config)


def run(server: uvicorn.Server, sock: socket.socket) -> None:
    """Serve on ``sock`` until SIGTERM or SIGINT, then return normally (exit status 0).

    uvicorn handles the signal (stop accepting, let in-flight requests finish, run the lifespan's
    shutdown) and then raises it again for the handler that was there before; a quiet handler set
    here takes that second delivery, so a drained stop is not reported as a death by signal.
    """
    if threading.current_thread() is not threading.main_thread():
        server.run(sockets=[sock])
        return
    before = {sig: signal.signal(sig, lambda *_: None) for sig in (signal.SIGTERM, signal.SIGINT)}
    try:
        server.run(sockets=[sock])
    finally:
        for sig, handler in before.items():
            signal.signal(sig, handler)


def is_loopback(host: str) -> bool:
    return host in ("localhost", "::1") or host.startswith("127.")


__all__ = ["bind", "is_loopback", "make_server", "run"]
