"""The FastAPI app: routes, OpenAI-shaped error answers, and the batchers' lifetime (started with the
app, drained when it stops)."""

from __future__ import annotations

import asyncio
import logging
from contextlib import asynccontextmanager
from dataclasses import dataclass

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, Response
from starlette.exceptions import HTTPException

from tformer.core.errors import TformerError
from tformer.generate.batching_report import prediction_device
from tformer.generate.continuous import ContinuousBatcher
from tformer.serve.checks import ModelInfo
from tformer.serve.completions import ChatCompletions, Completions
from tformer.serve.embeddings import EmbeddingBatcher, Embeddings
from tformer.serve.errors import APIError
from tformer.serve.gate import Gate
from tformer.serve.metrics import Metrics

JSON_TYPES = ("application/json", "application/json-seq")
# curl -d labels every body form-urlencoded unless told otherwise: read such a body as JSON (a body that is
# not JSON still gets its 400), so the one-line curl call works as users type it.
READ_AS_JSON = (*JSON_TYPES, "application/x-www-form-urlencoded")
log = logging.getLogger("tformer.serve")


@dataclass
class ServeSettings:
    """Limits and defaults of one server (the `tformer serve` flags)."""

    max_batch: int = 32
    max_queue: int = 256
    slot_positions: int | None = None  # columns of each row of the KV pool (None: the context window, at most 1024)
    compile: bool = False  # decode steps through torch.compile'd graphs (one row; any rows), compiled at start
    max_body_bytes: int = 1 << 20
    request_timeout: float | None = 60.0  # seconds per completion; then finish_reason "timeout"
    body_timeout: float | None = None  # seconds to receive a body (None: request_timeout, or 60)
    batch_window_ms: float = 5.0
    api_key: str | None = None
    normalize: bool = True  # embeddings: L2-normalised mean pooling
    prediction_device: object = None  # the Device /metrics predicts decode speed for (None: this machine)


def create_app(model, tokenizer=None, *, name: str = "model", settings: ServeSettings | None = None) -> FastAPI:
    """The app serving ``model``: /v1/completions and /v1/chat/completions for generative models, /v1/embeddings
    for encoders."""
    s = settings or ServeSettings()
    if model.config.traits.images:
        raise TformerError(f"{name} is {model.config.traits.label}; tformer serve answers text requests "
                           "(completions, embeddings): serve a decoder, encoder-decoder or text encoder checkpoint")
    info = ModelInfo.of(model, tokenizer, name)
    model.eval()
    if info.generates:
        engine = ContinuousBatcher(model, max_batch=s.max_batch, max_queue=s.max_queue,
                                   slot_positions=s.slot_positions, compile=s.compile)
    elif s.compile:
        raise TformerError(f"--compile compiles the decode step, and {name} ({model.config.traits.label}) does not "
                           "decode; drop --compile")
    else:
        engine = EmbeddingBatcher(model, max_batch=s.max_batch, max_queue=s.max_queue,
                                  window=s.batch_window_ms / 1000, normalize=s.normalize)
    metrics = Metrics(queue_depth=lambda: engine.queue_depth, active=lambda: engine.active)
    if info.generates:
        metrics.watch_batching(engine.stats, model.config, s.prediction_device or prediction_device())

    @asynccontextmanager
    async def lifespan(app):
        engine.start()
        if getattr(engine, "compile_seconds", None) is not None:  # before the first request is taken
            log.warning("tformer serve: decode step compiled in %.1f s (two graphs: one row, any rows; every context)",
                        engine.compile_seconds)
        try:
            yield
        finally:  # uvicorn has let in-flight requests finish; what is still queued runs to its end
            await asyncio.to_thread(engine.shutdown, True)

    app = FastAPI(title="tformer serve", lifespan=lambda app: lifespan(app), docs_url=None, redoc_url=None,
                  openapi_url=None)
    app.state.engine, app.state.metrics, app.state.info, app.state.settings = engine, metrics, info, s
    completions = Completions(engine, info, metrics, s.request_timeout) if info.generates else None
    chats = ChatCompletions(engine, info, metrics, s.request_timeout) if info.generates else None
    embeddings = Embeddings(engine, info, metrics) if not info.generates else None

    def wrong_endpoint(path: str, use: str) -> APIError:
        return APIError(400, f"{name} is {'an encoder' if path.endswith('completions') else 'a generative'} model; "
                        f"{path} is not served for it: use {use}", code="wrong_endpoint")

    @app.post("/v1/completions")
    async def post_completions(request: Request):
        _check_json(request)
        if completions is None:
            raise wrong_endpoint("/v1/completions", "/v1/embeddings")
        return await completions(request)

    @app.post("/v1/chat/completions")
    async def post_chat_completions(request: Request):
        _check_json(request)
        if chats is None:
            raise wrong_endpoint("/v1/chat/completions", "/v1/embeddings")
        return await chats(request)

    @app.post("/v1/embeddings")
    async def post_embeddings(request: Request):
        _check_json(request)
        if embeddings is None:
            raise wrong_endpoint("/v1/embeddings", "/v1/completions")
        return await embeddings(request)

    @app.get("/health")
    async def health():
        return {"status": "ok", "model": name, "active": engine.active, "queued": engine.queue_depth}

    @app.get("/metrics")
    async def get_metrics():
        return Response(metrics.render(), media_type="text/plain; version=0.0.4; charset=utf-8")

    _install_error_handlers(app, metrics)
    body_timeout = s.body_timeout or s.request_timeout or 60.0
    app.add_middleware(Gate, metrics=metrics, api_key=s.api_key, max_body_bytes=s.max_body_bytes,
                       body_timeout=body_timeout)
    return app


def _check_json(request: Request) -> None:
    """A body labelled as something other than JSON is refused (415); an unlabelled one, or curl's default
    label, is read as JSON."""
    kind = request.headers.get("content-type")
    if kind is not None and kind.split(";")[0].strip().lower() not in READ_AS_JSON:
        raise APIError(415, f"Content-Type is {kind!r}; send the body as application/json",
                       code="unsupported_media_type")


def _install_error_handlers(app: FastAPI, metrics: Metrics) -> None:
    def answer(err: APIError) -> JSONResponse:
        metrics.errors.labels(err.code).inc()
        return JSONResponse(err.body(), status_code=err.status, headers=err.headers)

    @app.exception_handler(APIError)
    async def api_error(request, exc: APIError):
        return answer(exc)

    @app.exception_handler(HTTPException)
    async def http_error(request, exc: HTTPException):
        if exc.status_code == 404:
            return answer(APIError(404, f"no route {request.url.path}; the routes are POST /v1/completions, POST "
                                   "/v1/chat/completions, POST /v1/embeddings, GET /health, GET /metrics",
                                   code="not_found"))
        if exc.status_code == 405:
            allow = (exc.headers or {}).get("Allow", "")
            return answer(APIError(405, f"{request.method} is not allowed on {request.url.path}; use {allow}",
                                   code="method_not_allowed", headers={"Allow": allow}))
        return answer(APIError(exc.status_code, str(exc.detail), code=f"http_{exc.status_code}"))

    @app.exception_handler(RequestValidationError)
    async def validation_error(request, exc: RequestValidationError):
        first = (exc.errors() or [{}])[0]
        loc = [p for p in first.get("loc", ()) if p != "body"]
        return answer(APIError(400, f"invalid request: {first.get('msg', 'bad value')}",
                               param=str(loc[0]) if loc else None))

    @app.exception_handler(Exception)
    async def crash(request, exc: Exception):  # a bug: still JSON, and the server goes on; its cause is logged
        log.error("500 on %s %s: %s", request.method, request.url.path, type(exc).__name__, exc_info=exc)
        return answer(APIError(500, f"internal error: {type(exc).__name__}", code="internal_error"))


__all__ = ["ServeSettings", "create_app"]
