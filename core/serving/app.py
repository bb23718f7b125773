"""The OpenAI-compatible FastAPI app: /v1/models, /v1/completions, /v1/chat/completions, /health, /metrics.

Every error is an OpenAI-style body ``{"error": {"message", "type", "param", "code"}}`` with its HTTP status:
400 for a request the server cannot run as sent (malformed JSON, invalid UTF-8, wrong types, out-of-range or
over-cap values, a prompt or max_tokens beyond the context, an invalid JSON schema, no messages, a message with null
content, more than 256 prompts), 401 without the API key (compared in constant time), 404 for an unknown model or
route, 405 for a wrong method, 413 for a body over 8 MiB, 415 for a body not sent as application/json, 500 when the
engine step computing the request failed (the engine serves on), 503 with Retry-After when the queue is full.
Tokenization, chat templates and grammar compilation run off the event loop. Bad requests are refused before
they reach the engine, so they never disturb the requests running. A client that goes away mid-request (streamed
or not) has its request aborted, which returns its KV blocks to the pool.
"""

from __future__ import annotations

import asyncio
import hmac
import json
import time

from fastapi import Depends, FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, Response, StreamingResponse
from pydantic import ValidationError
from starlette.exceptions import HTTPException as StarletteHTTPException

from engine.core.engine.async_llm import AsyncLLM, EngineDeadError, QueueFullError, RequestFailedError

from . import parsers
from .handlers import Handler, OpenAIError
from .metrics import CONTENT_TYPE, ServerMetrics
from .protocol import ChatCompletionRequest, CompletionRequest


def build_app(async_llm: AsyncLLM, model_name: str, api_key: str | None = None,
              key_health_and_metrics: bool = False, reasoning_parser: str | None = None,
              tool_call_parser: str | None = None) -> FastAPI:
    """The app serving ``model_name``. With ``api_key``, /v1 requires 'Authorization: Bearer KEY'; /health and
    /metrics stay open (load balancers, Prometheus) unless ``key_health_and_metrics``. ``reasoning_parser`` and
    ``tool_call_parser`` name output parsers (serving/parsers; ValueError for an unknown name)."""
    app = FastAPI(title="engine", docs_url=None, redoc_url=None)
    metrics = ServerMetrics(async_llm, model_name)
    handler = Handler(async_llm, model_name, metrics,
                      reasoning_parser=parsers.reasoning_parser(reasoning_parser) if reasoning_parser else None,
                      tool_parser=parsers.tool_parser(tool_call_parser) if tool_call_parser else None)
    app.state.async_llm, app.state.metrics = async_llm, metrics
    created = int(time.time())

    @app.exception_handler(OpenAIError)
    async def _openai_error(request: Request, exc: OpenAIError):
        return exc.response()

    @app.exception_handler(StarletteHTTPException)  # unknown routes (404), wrong methods (405): OpenAI's shape too
    async def _http_error(request: Request, exc: StarletteHTTPException):
        kind = "not_found_error" if exc.status_code == 404 else "invalid_request_error"
        return OpenAIError(exc.status_code, f"{request.method} {request.url.path}: {exc.detail}", kind,
                           headers=getattr(exc, "headers", None)).response()

    @app.exception_handler(RequestValidationError)
    async def _validation_error(request: Request, exc: RequestValidationError):
        err = exc.errors()[0] if exc.errors() else {"loc": (), "msg": str(exc)}
        param = ".".join(str(x) for x in err.get("loc", ())) or None
        return OpenAIError(400, f"{param}: {err.get('msg')}", param=param).response()

    # A dependency rather than an HTTP middleware: Starlette's BaseHTTPMiddleware hides client disconnects from
    # the endpoint, and a non-streamed request must notice its client leaving.
    expected = f"Bearer {api_key}".encode() if api_key else b""

    async def authorized(request: Request):
        # constant time: the comparison must not tell an attacker how many leading characters were right
        if api_key and not hmac.compare_digest(request.headers.get("authorization", "").encode(), expected):
            raise OpenAIError(401, "invalid or missing API key: send 'Authorization: Bearer <key>'",
                              "authentication_error", code="invalid_api_key")

    v1 = [Depends(authorized)]
    ops = v1 if key_health_and_metrics else []

    @app.get("/health", dependencies=ops)
    async def health():
        if not async_llm.is_running:
            raise OpenAIError(503, "the engine loop is not running", "server_error")
        return {"status": "ok"}

    @app.get("/metrics", dependencies=ops)
    async def prometheus():
        return Response(metrics.render(), media_type=CONTENT_TYPE)

    @app.get("/v1/models", dependencies=v1)
    async def models():
        return {"object": "list", "data": [{"id": model_name, "object": "model", "created": created,
                                            "owned_by": "engine", "max_model_len": async_llm.llm.max_model_len}]}

    @app.post("/v1/completions", dependencies=v1)
    async def completions(request: Request):
        req = await _parse(request, CompletionRequest, model_name)
        return await _run(request, handler.completion(req), req.stream)

    @app.post("/v1/chat/completions", dependencies=v1)
    async def chat(request: Request):
        req = await _parse(request, ChatCompletionRequest, model_name)
        return await _run(request, handler.chat(req), req.stream)

    return app


MAX_BODY_BYTES = 8 << 20  # 8 MiB: far beyond any context's worth of text; a larger body is refused unread


async def _read_body(request: Request) -> bytes:
    """The body, refused with 415 unless it is JSON and with 413 past MAX_BODY_BYTES (before reading it when the
    client says its length, else as soon as it passes the limit)."""
    ctype = request.headers.get("content-type", "").split(";")[0].strip().lower()
    if ctype != "application/json":
        raise OpenAIError(415, f"the request body must be JSON sent as 'Content-Type: application/json', not "
                               f"{ctype or 'no content type'!r}")
    length = request.headers.get("content-length")
    if length is not None and length.isdigit() and int(length) > MAX_BODY_BYTES:
        raise OpenAIError(413, f"the request body has {int(length)} bytes; at most {MAX_BODY_BYTES} are accepted")
    chunks, size = [], 0
    async for chunk in request.stream():
        size += len(chunk)
        if size > MAX_BODY_BYTES:
            raise OpenAIError(413, f"the request body passes {MAX_BODY_BYTES} bytes, the most accepted")
        chunks.append(chunk)
    return b"".join(chunks)


async def _parse(request: Request, model, model_name: str):
    body = await _read_body(request)
    try:
        data = json.loads(body.decode("utf-8"))
    except UnicodeDecodeError as exc:
        raise OpenAIError(400, f"the request body is not valid UTF-8 ({exc.reason} at byte {exc.start})") from exc
    except json.JSONDecodeError as exc:
        raise OpenAIError(400, f"the request body is not valid JSON: {exc.msg} (line {exc.lineno}, column "
                               f"{exc.colno})") from exc
    if not isinstance(data, dict):
        raise OpenAIError(400, f"the request body must be a JSON object, got {type(data).__name__}")
    try:
        req = model.model_validate(data)
    except ValidationError as exc:
        err = exc.errors()[0]
        param = ".".join(str(x) for x in err["loc"]) or None
        more = f" (and {exc.error_count() - 1} more)" if exc.error_count() > 1 else ""
        raise OpenAIError(400, f"{param}: {err['msg']}{more}", param=param) from exc
    if req.model != model_name:
        raise OpenAIError(404, f"the model {req.model!r} does not exist; this server serves {model_name!r}",
                          "invalid_request_error", param="model", code="model_not_found")
    return req


async def _run(request: Request, prepared, stream: bool):
    """Start the prepared request's engine requests and answer it, streamed or whole."""
    try:
        job = await prepared
    except QueueFullError as exc:
        raise OpenAIError(503, f"the server is busy: {exc}", "server_error", headers={"Retry-After": "1"}) from exc
    except EngineDeadError as exc:
        raise OpenAIError(503, str(exc), "server_error") from exc
    if stream:
        return StreamingResponse(job.events(), media_type="text/event-stream",
                                 headers={"Cache-Control": "no-cache", "X-Request-Id": job.id})
    task = asyncio.ensure_future(job.collect())
    try:
        while True:  # a non-streamed request whose client went away is aborted too
            done, _ = await asyncio.wait({task}, timeout=0.25)
            if done:
                break
            if await request.is_disconnected():
                task.cancel()
                return Response(status_code=499)
    except BaseException:
        task.cancel()
        raise
    try:
        return JSONResponse(task.result())
    except EngineDeadError as exc:
        raise OpenAIError(503, str(exc), "server_error") from exc
    except RequestFailedError as exc:
        raise OpenAIError(500, str(exc), "server_error") from exc

