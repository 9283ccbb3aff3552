"""The machinery of tests/serve: tiny checkpoints and a live server on loopback (uvicorn in a background
thread). Not a test module itself."""

from __future__ import annotations

import threading
import time

import httpx
from tiny_checkpoint import write_checkpoint as write_tiny

from tformer.interop.checkpoint import load_checkpoint
from tformer.serve import ServeSettings, bind, create_app, make_server

TEXT = "to be or not to be, that is the question. héllo wörld\n"


def write_checkpoint(path, arch: str, tokenizer: bool, max_positions: int = 48, **kw):
    return write_tiny(path, arch, tokenizer, TEXT, max_positions, **kw)


class LiveServer:
    """One app served by uvicorn on 127.0.0.1:<free port> in a daemon thread."""

    def __init__(self, model, tokenizer, name: str, settings: ServeSettings):
        self.app = create_app(model, tokenizer, name=name, settings=settings)
        self.sock = bind("127.0.0.1", 0)
        self.port = self.sock.getsockname()[1]
        self.url = f"http://127.0.0.1:{self.port}"
        self.server = make_server(self.app)
        self.thread = threading.Thread(target=self.server.run, kwargs={"sockets": [self.sock]}, daemon=True)
        self.thread.start()
        while not self.server.started:
            if not self.thread.is_alive():
                raise RuntimeError("the test server did not start")
            time.sleep(0.02)
        self.client = httpx.Client(base_url=self.url, timeout=30)

    @property
    def engine(self):
        return self.app.state.engine

    def stop(self) -> None:
        self.client.close()
        self.server.should_exit = True
        self.thread.join(30)


def live(path, name, pace: float = 0.0, **settings):
    """A live server; ``pace`` seconds added to each decode step make a long request outlast a client's
    disconnect by a wide margin (the disconnect tests need the sequence still running when it arrives)."""
    model, tok = load_checkpoint(path)
    server = LiveServer(model, tok, name, ServeSettings(**settings))
    if pace:
        runner, step = server.engine.runner, server.engine.runner.step

        def paced_step(cache, tokens):
            time.sleep(pace)
            return step(cache, tokens)

        runner.step = paced_step
    return server
