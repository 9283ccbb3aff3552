"""The outermost layer of the app (plain ASGI): API key, body size and read time, and per-request metrics.

The body is read here in full before the route runs, counting bytes as they arrive, so a chunked body
without Content-Length is cut off at the limit as surely as one that declares its size; a client that
sends its body too slowly gets 408 after ``body_timeout`` seconds instead of holding a connection.
"""

from __future__ import annotations

import asyncio
import hmac
import time

from tformer.serve.errors import APIError

KNOWN_PATHS = ("/v1/completions", "/v1/embeddings", "/health", "/metrics")


class Gate:
    def __init__(self, app, *, metrics, api_key: str | None, max_body_bytes: int, body_timeout: float):
        self.app, self.metrics = app, metrics
        self.api_key = api_key.encode() if api_key else None
        self.max_body_bytes, self.body_timeout = max_body_bytes, body_timeout

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        path = scope["path"] if scope["path"] in KNOWN_PATHS else "other"
        started, status = time.perf_counter(), [500]

        async def send_status(message):
            if message["type"] == "http.response.start":
                status[0] = message["status"]
            await send(message)

        try:
            self._authorise(scope)
            receive = await self._buffered(scope, receive)
            if receive is None:  # the client left before its body was complete: nobody to answer
                status[0] = 499
                return
            await self.app(scope, receive, send_status)
        except APIError as err:
            await self.answer(send_status, err)
        finally:
            self.metrics.requests.labels(path, str(status[0])).inc()
            self.metrics.latency.labels(path).observe(time.perf_counter() - started)

    async def answer(self, send, err: APIError) -> None:
        self.metrics.errors.labels(err.code).inc()
        body = err.encoded()
        headers = [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode())]
        headers += [(k.lower().encode(), v.encode()) for k, v in err.headers.items()]
        await send({"type": "http.response.start", "status": err.status, "headers": headers})
        await send({"type": "http.response.body", "body": body})

    def _authorise(self, scope) -> None:
        if self.api_key is None:
            return
        given = dict(scope["headers"]).get(b"authorization", b"")
        scheme, _, token = given.partition(b" ")
        # compare_digest: the time taken does not reveal how much of the key matched
        if scheme.lower() != b"bearer" or not hmac.compare_digest(token.strip(), self.api_key):
            raise APIError(401, "missing or wrong API key; send the header 'Authorization: Bearer <key>'",
                           code="invalid_api_key", headers={"WWW-Authenticate": "Bearer"})

    async def _buffered(self, scope, receive):
        """A receive that replays the whole body at once, or None when the client went away first."""
        declared = dict(scope["headers"]).get(b"content-length")
        if declared is not None:
            if not declared.isdigit():
                raise APIError(400, "Content-Length is not a whole number", code="bad_header")
            if int(declared) > self.max_body_bytes:
                raise APIError(413, f"the body is {int(declared)} bytes, over the limit of {self.max_body_bytes} "
                               "(--max-body-bytes)", code="body_too_large")
        chunks, size, more = [], 0, True
        deadline = time.monotonic() + self.body_timeout
        while more:
            try:
                message = await asyncio.wait_for(receive(), max(0.0, deadline - time.monotonic()))
            except asyncio.TimeoutError:
                raise APIError(408, f"the body did not arrive within {self.body_timeout:g} s; send it at once",
                               code="body_timeout", headers={"Connection": "close"}) from None
            if message["type"] == "http.disconnect":
                return None
            chunk = message.get("body", b"")
            size += len(chunk)
            if size > self.max_body_bytes:
                raise APIError(413, f"the body is over the limit of {self.max_body_bytes} bytes (--max-body-bytes)",
                               code="body_too_large", headers={"Connection": "close"})
            chunks.append(chunk)
            more = message.get("more_body", False)
        body, replayed = b"".join(chunks), [False]

        async def replay():
            if not replayed[0]:
                replayed[0] = True
                return {"type": "http.request", "body": body, "more_body": False}
            return await receive()  # after the body: waits for the client's disconnect

        return replay


__all__ = ["KNOWN_PATHS", "Gate"]
