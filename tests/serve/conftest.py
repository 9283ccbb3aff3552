"""Fixtures of tests/serve: tiny checkpoints built once, live servers on loopback (module-scoped)."""

from __future__ import annotations

import pytest
from serve_kit import live as _live
from serve_kit import write_checkpoint

from tformer.machine import resolve_hardware


@pytest.fixture(scope="module")
def checkpoints(tmp_path_factory):
    root = tmp_path_factory.mktemp("serve")
    return {"dec": write_checkpoint(root / "dec", "decoder", tokenizer=True),
            "ids": write_checkpoint(root / "ids", "decoder", tokenizer=False, eos_token_id=3),
            "long": write_checkpoint(root / "long", "decoder", tokenizer=False, max_positions=1024),
            "enc": write_checkpoint(root / "enc", "encoder", tokenizer=False)}


@pytest.fixture(scope="module")
def dec(checkpoints):
    server = _live(checkpoints["dec"], "tiny-dec", max_body_bytes=4096, request_timeout=20, body_timeout=2)
    yield server
    server.stop()


@pytest.fixture(scope="module")
def ids_server(checkpoints):
    # a spec-table device: /metrics' predictions do not depend on whether this machine has a saved profile
    server = _live(checkpoints["ids"], "tiny-ids", prediction_device=resolve_hardware("h100-sxm"))
    yield server
    server.stop()


@pytest.fixture(scope="module")
def enc(checkpoints):
    server = _live(checkpoints["enc"], "tiny-enc", max_batch=8, batch_window_ms=20)
    yield server
    server.stop()


@pytest.fixture(scope="module")
def slow(checkpoints):
    """Decode steps of at least 5 ms and a 50 ms limit: a 1000-token request runs out of time."""
    server = _live(checkpoints["long"], "tiny-timeout", pace=0.005, request_timeout=0.05)
    yield server
    server.stop()


@pytest.fixture(scope="module")
def slow_queue(checkpoints):
    """One request at a time and one waiting: the rest are refused (429)."""
    server = _live(checkpoints["long"], "tiny-one", pace=0.005, max_batch=1, max_queue=1)
    yield server
    server.stop()


@pytest.fixture(scope="module")
def keyed(checkpoints):
    server = _live(checkpoints["ids"], "tiny-key", api_key="s3cret")
    yield server
    server.stop()


@pytest.fixture(scope="module")
def paced(checkpoints):
    """Decode steps of at least 5 ms: a 1000-token request runs for seconds."""
    server = _live(checkpoints["long"], "tiny-paced", pace=0.005)
    yield server
    server.stop()
