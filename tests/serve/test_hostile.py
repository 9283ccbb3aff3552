"""Hostile clients against a live server: each gets its documented answer (status, OpenAI error shape,
the field at fault), and the server answers a normal request afterwards."""

from __future__ import annotations

import json
import socket
import threading
import time

import httpx
import pytest

JSON = {"content-type": "application/json"}


def assert_alive(server) -> None:
    r = server.client.post("/v1/completions", json={"prompt": [1, 2], "max_tokens": 2, "temperature": 0})
    assert r.status_code == 200, r.text
    assert len(r.json()["choices"][0]["token_ids"]) >= 1 or r.json()["choices"][0]["finish_reason"] == "stop"


def assert_error(r, status: int, param=None) -> dict:
    assert r.status_code == status, r.text
    err = r.json()["error"]
    assert set(err) == {"message", "type", "param", "code"} and err["message"]
    assert err["param"] == param, err
    return err


def body(**fields) -> bytes:
    return json.dumps({"prompt": [1, 2, 3], **fields}).encode()


# (name, raw body, status, param)
BAD_BODIES = [
    ("malformed-json", b'{"prompt": ', 400, None),
    ("json-array", b"[1, 2]", 400, None),
    ("json-string", b'"to be"', 400, None),
    ("json-null", b"null", 400, None),
    ("empty-body", b"", 400, None),
    ("missing-prompt", b"{}", 400, "prompt"),
    ("prompt-number", body(prompt=5), 400, "prompt"),
    ("prompt-object", body(prompt={"text": "x"}), 400, "prompt"),
    ("prompt-two-strings", body(prompt=["to", "be"]), 400, "prompt"),
    ("prompt-bools", body(prompt=[True, False]), 400, "prompt"),
    ("prompt-floats", body(prompt=[1.5, 2.0]), 400, "prompt"),
    ("prompt-empty-text", body(prompt=""), 400, "prompt"),
    ("prompt-empty-ids", body(prompt=[]), 400, "prompt"),
    ("prompt-empty-inner", body(prompt=[[]]), 400, "prompt"),
    ("prompt-too-long-ids", body(prompt=[1] * 49), 400, "prompt"),
    ("prompt-too-long-text", body(prompt="to be " * 10), 400, "prompt"),
    ("prompt-fills-context", body(prompt=[1] * 48), 400, "prompt"),
    ("prompt-char-not-in-vocab", body(prompt="xyz"), 400, "prompt"),
    ("id-out-of-vocab", body(prompt=[1, 10 ** 6]), 400, "prompt"),
    ("id-negative", body(prompt=[1, -1]), 400, "prompt"),
    ("id-huge", body(prompt=[2 ** 70]), 400, "prompt"),
    ("id-4000-digits", b'{"prompt": [' + b"9" * 4000 + b"]}", 400, "prompt"),
    ("max-tokens-string", body(max_tokens="5"), 400, "max_tokens"),
    ("max-tokens-bool", body(max_tokens=True), 400, "max_tokens"),
    ("max-tokens-float", body(max_tokens=4.0), 400, "max_tokens"),
    ("max-tokens-zero", body(max_tokens=0), 400, "max_tokens"),
    ("max-tokens-negative", body(max_tokens=-3), 400, "max_tokens"),
    ("max-tokens-beyond-context", body(max_tokens=46), 400, "max_tokens"),
    ("max-tokens-huge", body(max_tokens=10 ** 30), 400, "max_tokens"),
    ("temperature-negative", body(temperature=-0.1), 400, "temperature"),
    ("temperature-too-high", body(temperature=2.5), 400, "temperature"),
    ("temperature-string", body(temperature="hot"), 400, "temperature"),
    ("temperature-nan", b'{"prompt": [1], "temperature": NaN}', 400, "temperature"),
    ("temperature-infinity", b'{"prompt": [1], "temperature": Infinity}', 400, "temperature"),
    ("top-p-zero", body(top_p=0), 400, "top_p"),
    ("top-p-above-one", body(top_p=1.5), 400, "top_p"),
    ("top-k-negative", body(top_k=-1), 400, "top_k"),
    ("top-k-float", body(top_k=1.5), 400, "top_k"),
    ("n-two", body(n=2), 400, "n"),
    ("stop-five", body(stop=["a", "b", "c", "d", "e"]), 400, "stop"),
    ("stop-number", body(stop=5), 400, "stop"),
    ("stop-empty-string", body(stop=[""]), 400, "stop"),
    ("stop-token-out-of-vocab", body(stop_token_ids=[999]), 400, "stop_token_ids"),
    ("seed-negative", body(seed=-1), 400, "seed"),
    ("seed-string", body(seed="x"), 400, "seed"),
    ("stream-string", body(stream="yes"), 400, "stream"),
    ("model-number", body(model=5), 400, "model"),
    ("unknown-field", body(echo=True), 400, "echo"),
    ("deeply-nested", b'{"prompt": ' + b"[" * 2000 + b"]" * 2000 + b"}", 400, None),
    ("not-utf8", b'{"prompt": "\xff\xfe"}', 400, None),
]


@pytest.mark.parametrize("raw,status,param", [c[1:] for c in BAD_BODIES], ids=[c[0] for c in BAD_BODIES])
def test_bad_body(dec, raw, status, param):
    err = assert_error(dec.client.post("/v1/completions", content=raw, headers=JSON), status, param)
    if param == "max_tokens" and b"46" in raw:
        assert "<= 45" in err["message"]  # the largest value that fits: 48 positions - 3 prompt tokens
    assert_alive(dec)


@pytest.mark.parametrize("method,path,status", [("GET", "/v1/completions", 405), ("DELETE", "/health", 405),
                                                ("POST", "/v1/chat", 404), ("GET", "/nothing", 404)])
def test_wrong_method_or_path(dec, method, path, status):
    r = dec.client.request(method, path)
    assert_error(r, status)
    if status == 405:
        assert r.headers["allow"]
    assert_alive(dec)


def test_wrong_content_type(dec):
    r = dec.client.post("/v1/completions", content=body(), headers={"content-type": "text/plain"})
    assert_error(r, 415)
    # curl -d's default label: the body is read as JSON (curl -d '{...}' works without -H)
    r = dec.client.post("/v1/completions", content=body(), headers={"content-type": "application/x-www-form-urlencoded"})
    assert r.status_code == 200, r.text
    assert_alive(dec)


def test_wrong_endpoint_for_the_model(dec, enc):
    assert "/v1/embeddings" in assert_error(dec.client.post("/v1/embeddings", json={"input": [1, 2]}), 400)["message"]
    err = assert_error(enc.client.post("/v1/completions", json={"prompt": [1, 2]}), 400)
    assert "/v1/completions" in err["message"]
    assert_alive(dec)


def test_text_for_a_model_without_tokenizer(ids_server):
    assert_error(ids_server.client.post("/v1/completions", json={"prompt": "to be"}), 400, "prompt")
    assert_error(ids_server.client.post("/v1/completions", json={"prompt": [1], "stop": "x"}), 400, "stop")
    assert_alive(ids_server)


def test_body_over_the_limit_with_content_length(dec):
    r = dec.client.post("/v1/completions", content=b'{"prompt": "' + b"a" * 5000 + b'"}', headers=JSON)
    assert_error(r, 413)
    assert_alive(dec)


def test_body_over_the_limit_chunked(dec):
    def chunks():
        yield b'{"prompt": "'
        for _ in range(10):
            yield b"a" * 1000
        yield b'"}'

    r = dec.client.post("/v1/completions", content=chunks(), headers=JSON)
    assert "content-length" not in r.request.headers
    assert_error(r, 413)
    assert_alive(dec)


def _raw(server, data: bytes) -> socket.socket:
    sock = socket.create_connection(("127.0.0.1", server.port), timeout=30)
    sock.sendall(data)
    return sock


def _read_all(sock: socket.socket) -> bytes:
    """Everything the server sends until it closes the connection."""
    data = b""
    while chunk := sock.recv(65536):
        data += chunk
    return data


def _head(path: str, length: int, extra: str = "") -> bytes:
    return (f"POST {path} HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
            f"Content-Length: {length}\r\n{extra}\r\n").encode()


def test_slow_client_byte_by_byte_is_answered(dec):
    payload = body(max_tokens=2, temperature=0)
    sock = _raw(dec, _head("/v1/completions", len(payload)))
    for b in payload:
        sock.sendall(bytes([b]))
        time.sleep(0.005)
    reply = sock.recv(65536)
    sock.close()
    assert reply.startswith(b"HTTP/1.1 200")
    assert_alive(dec)


def test_stalled_body_times_out_with_408(dec):
    payload = body()
    sock = _raw(dec, _head("/v1/completions", len(payload)) + payload[:5])
    reply = _read_all(sock)  # body_timeout is 2 s on this server; the answer closes the connection
    sock.close()
    assert reply.startswith(b"HTTP/1.1 408")
    assert b'"body_timeout"' in reply
    assert_alive(dec)


def test_abrupt_close_mid_body(dec):
    payload = body()
    sock = _raw(dec, _head("/v1/completions", len(payload)) + payload[:7])
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, b"\x01\x00\x00\x00\x00\x00\x00\x00")  # RST on close
    sock.close()
    assert_alive(dec)


def test_garbage_instead_of_http(dec):
    sock = _raw(dec, b"\x00\x01\x02 not http at all\r\n\r\n")
    sock.recv(65536)
    sock.close()
    assert_alive(dec)


def _finished(server) -> int:
    return sum(server.engine.stats.finished.values())


def _wait_idle(server, finished: int | None = None) -> None:
    """Until nothing runs or waits (and, given ``finished``, that many sequences have ended in all)."""
    deadline = time.monotonic() + 20
    while time.monotonic() < deadline and (server.engine.active or server.engine.queue_depth or
                                           (finished is not None and _finished(server) < finished)):
        time.sleep(0.01)
    assert server.engine.active == 0 and server.engine.queue_depth == 0


def _cancelled(server) -> int:
    return server.engine.stats.finished["cancelled"]


LONG = {"prompt": [1, 2], "max_tokens": 1000, "temperature": 0, "stop_token_ids": []}


def test_client_leaves_mid_stream_frees_its_rows(paced):
    before, ended = _cancelled(paced), _finished(paced)
    payload = json.dumps({**LONG, "stream": True}).encode()
    sock = _raw(paced, _head("/v1/completions", len(payload)) + payload)
    seen = b""
    while b"data: " not in seen:  # streaming has begun
        seen += sock.recv(4096)
    sock.close()
    _wait_idle(paced, ended + 1)
    assert _cancelled(paced) == before + 1
    assert_alive(paced)


def test_client_leaves_while_waiting_for_a_plain_answer(slow_queue):
    before, ended = _cancelled(slow_queue), _finished(slow_queue)
    payload = json.dumps(LONG).encode()
    sock = _raw(slow_queue, _head("/v1/completions", len(payload)) + payload)
    deadline = time.monotonic() + 20
    while slow_queue.engine.active == 0 and time.monotonic() < deadline:
        time.sleep(0.002)
    sock.close()
    _wait_idle(slow_queue, ended + 1)
    assert _cancelled(slow_queue) == before + 1
    assert_alive(slow_queue)


def test_httpx_stream_closed_early(paced):
    before, ended = _cancelled(paced), _finished(paced)
    with paced.client.stream("POST", "/v1/completions", json={**LONG, "stream": True}) as r:
        next(r.iter_lines())
    _wait_idle(paced, ended + 1)
    assert _cancelled(paced) == before + 1
    assert_alive(paced)


def test_queue_full_answers_429_with_retry_after(slow_queue):
    statuses, headers = [], []

    def ask():
        with httpx.Client(base_url=slow_queue.url, timeout=30) as c:
            r = c.post("/v1/completions", json={"prompt": [1, 2], "max_tokens": 45, "temperature": 0,
                                                "stop_token_ids": []})
            statuses.append(r.status_code)
            if r.status_code == 429:
                headers.append(r.headers.get("retry-after"))
                assert r.json()["error"]["code"] == "queue_full"

    for _ in range(5):  # each round floods a server that holds one running and one waiting request
        threads = [threading.Thread(target=ask) for _ in range(12)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        if 429 in statuses:
            break
    assert 429 in statuses and set(statuses) <= {200, 429}
    assert all(h == "1" for h in headers)
    _wait_idle(slow_queue)
    assert_alive(slow_queue)


@pytest.mark.parametrize("auth,status", [(None, 401), ("Bearer wrong", 401), ("s3cret", 401),
                                         ("Basic s3cret", 401), ("Bearer s3cret", 200)])
def test_api_key(keyed, auth, status):
    headers = {"authorization": auth} if auth else {}
    r = keyed.client.post("/v1/completions", json={"prompt": [1], "max_tokens": 1}, headers=headers)
    assert r.status_code == status, r.text
    if status == 401:
        assert_error(r, 401)
        assert r.headers["www-authenticate"] == "Bearer"
    assert keyed.client.get("/health", headers={"authorization": "Bearer s3cret"}).status_code == 200
