"""The OpenAI-compatible FastAPI app: /v1/models, /v1/completions, /v1/chat/completions, /health, /metrics.

Every error is an OpenAI-style body ``{"error": {"message", "type", "param", "code"}}`` with its HTTP status:
400 for a request the server cannot run as sent (malformed JSON, invalid UTF-8, wrong types, out-of-range or
over-cap values, a prompt or max_tokens beyond the context, an invalid JSON schema, no messages), 401 without the
API key, 404 for an unknown model, 503 with Retry-After when the queue is full. Bad requests are refused before
they reach the engine, so they never disturb the requests running. A client that goes away mid-request (streamed
or not) has its request aborted, which returns its KV blocks to the pool.
"""

from __future__ import annotations

import asyncio
import json
import time

from fastapi import Depends, FastAPI, Request
from fastapi.responses import JSONResponse, Response, StreamingResponse
from pydantic import ValidationError

from engine.core.engine.async_llm import AsyncLLM, EngineDeadError, QueueFullError, RequestFailedError

from .handlers import Handler, OpenAIError
from .metrics import CONTENT_TYPE, ServerMetrics
from .protocol import ChatCompletionRequest, CompletionRequest


def build_app(async_llm: AsyncLLM, model_name: str, api_key: str | None = None) -> FastAPI:
    app = FastAPI(title="engine", docs_url=None, redoc_url=None)
    metrics = ServerMetrics(async_llm, model_name)
    handler = Handler(async_llm, model_name, metrics)
    app.state.async_llm, app.state.metrics = async_llm, metrics
    created = int(time.time())

    @app.exception_handler(OpenAIError)
    async def _openai_error(request: Request, exc: OpenAIError):
        return exc.response()

    # A dependency rather than an HTTP middleware: Starlette's BaseHTTPMiddleware hides client disconnects from
    # the endpoint, and a non-streamed request must notice its client leaving.
    async def authorized(request: Request):
        if api_key and request.headers.get("authorization", "") != f"Bearer {api_key}":
            raise OpenAIError(401, "invalid or missing API key: send 'Authorization: Bearer <key>'",
                              "authentication_error", code="invalid_api_key")

    v1 = [Depends(authorized)]

    @app.get("/health")
    async def health():
        if not async_llm.is_running:
            raise OpenAIError(503, "the engine loop is not running", "server_error")
        return {"status": "ok"}

    @app.get("/metrics")
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


async def _parse(request: Request, model, model_name: str):
    body = await request.body()
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

