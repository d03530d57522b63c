"""The FastAPI app: routes, middleware (request ids, draining), auth and error handlers.

``build_app(ctx, server_args)`` is pure (tests drive it in-process); ``server.py`` runs it
under uvicorn with signal handling. Every route but ``/health`` and ``/ready`` (probes,
``probes.py``) carries the API-key dependency when a key is set (``/metrics`` too unless
``--metrics-without-auth``).
"""

from __future__ import annotations

import asyncio
import contextlib
import inspect
import json
import logging
import re
import uuid
from collections.abc import AsyncIterator
from typing import Any

from fastapi import APIRouter, Depends, FastAPI, Request
from fastapi.responses import JSONResponse, Response

import engine
from engine.entrypoints.openai.auth import make_api_key_dependency
from engine.entrypoints.openai.embedding_routes import add_embedding_routes
from engine.entrypoints.openai.errors import (
    APIError,
    error_body,
    install_error_handlers,
    model_not_found,
    queue_full,
)
from engine.entrypoints.openai.http_limits import RequestSizeLimitMiddleware
from engine.entrypoints.openai.metrics import CONTENT_TYPE
from engine.entrypoints.openai.openapi_schema import install_openapi
from engine.entrypoints.openai.probes import (
    PROBE_PATHS,
    liveness_failure,
    probe_response,
    readiness_failure,
)
from engine.entrypoints.openai.prompt_bounds import (
    chat_text_chars,
    check_prompt_chars,
    max_prompt_chars,
)
from engine.entrypoints.openai.protocol import (
    ChatCompletionRequest,
    CompletionRequest,
    DetokenizeRequest,
    DetokenizeResponse,
    ModelCard,
    ModelList,
    OpenAIBase,
    TokenizeRequest,
    TokenizeResponse,
)
from engine.entrypoints.openai.request_fields import check_extra_fields
from engine.entrypoints.openai.responses_routes import add_responses_routes
from engine.entrypoints.openai.serving_base import ClientDisconnected, ServingContext
from engine.entrypoints.openai.serving_chat import ChatServing, messages_to_dicts
from engine.entrypoints.openai.serving_completion import CompletionServing
from engine.entrypoints.openai.serving_embeddings import require_task
from engine.entrypoints.openai.stats_logger import StatsLogger, WarnOnce
from engine.entrypoints.openai.validation import (
    RequestLimits,
    reserved_template_kwargs,
    validate_chat_request,
    validate_completion_request,
    validate_messages,
    validate_template_kwargs,
)
from engine.server_config import ServerArgs

logger = logging.getLogger("engine.server")
_REQUEST_ID = re.compile(r"^[A-Za-z0-9._:@/+=-]{1,128}$")


async def scheduler_stats(engine_client: Any) -> Any:
    stats = engine_client.stats()
    return await stats if inspect.isawaitable(stats) else stats


class RequestIdMiddleware:
    """Echo ``X-Request-Id`` (or a fresh one) and answer 503 while the server drains.

    Pure ASGI, not ``BaseHTTPMiddleware``: the latter would hide client disconnects from
    streaming responses, which must cancel the stream to free the KV cache.
    """

    def __init__(self, app: Any, ctx: ServingContext) -> None:
        self.app = app
        self.ctx = ctx

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        given = dict(scope.get("headers") or []).get(b"x-request-id", b"").decode("latin-1")
        request_id = given if _REQUEST_ID.match(given) else uuid.uuid4().hex
        scope.setdefault("state", {})["request_id"] = request_id
        header = (b"x-request-id", request_id.encode())

        async def send_with_id(message: Any) -> None:
            if message["type"] == "http.response.start":
                message["headers"] = [*message.get("headers", []), header]
            await send(message)

        if self.ctx.inflight.draining and scope.get("path") not in PROBE_PATHS:
            body = error_body("The server is shutting down; retry on another replica.", 503)
            response = JSONResponse(body, status_code=503, headers={"Retry-After": "5"})
            await response(scope, receive, send_with_id)
            return
        await self.app(scope, receive, send_with_id)


def build_app(ctx: ServingContext, server_args: ServerArgs) -> FastAPI:
    warn_once = WarnOnce()
    stats_logger = StatsLogger(
        ctx.metrics, lambda: ctx.engine.stats(), server_args.log_stats_interval
    )

    @contextlib.asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        task = None
        if server_args.log_stats_interval > 0:
            task = asyncio.create_task(stats_logger.run())
        yield
        if task is not None:
            task.cancel()

    no_docs = server_args.api_key is not None
    app = FastAPI(
        title="Engine OpenAI-compatible API",
        version=engine.__version__,
        lifespan=lifespan,
        docs_url=None if no_docs else "/docs",
        redoc_url=None,
        redirect_slashes=False,
        openapi_url=None if no_docs else "/openapi.json",
    )
    app.state.ctx = ctx
    app.state.server_args = server_args
    ctx.prepare_timeout_s = server_args.request_prepare_timeout
    limits = RequestLimits(
        max_n=server_args.max_n,
        max_model_len=ctx.max_model_len,
        max_logprobs=ctx.max_logprobs,
        vocab_size=len(ctx.tokenizer),
        trust_request_chat_template=server_args.trust_request_chat_template,
        reserved_template_kwargs=reserved_template_kwargs(ctx.tokenizer),
        max_prompt_chars=max_prompt_chars(ctx.tokenizer, ctx.max_model_len),
    )
    install_error_handlers(app)
    install_openapi(app)

    @app.exception_handler(ClientDisconnected)
    async def _client_gone(request: Request, exc: ClientDisconnected) -> Response:
        # Nobody reads this answer; 499 (nginx's "client closed request") for the access log.
        return Response(status_code=499)

    if server_args.allowed_origins:
        from fastapi.middleware.cors import CORSMiddleware

        app.add_middleware(
            CORSMiddleware,
            allow_origins=server_args.allowed_origins,
            allow_credentials=True,
            allow_methods=["*"],
            allow_headers=["*"],
        )
    app.add_middleware(
        RequestSizeLimitMiddleware,
        max_bytes=server_args.max_request_body_bytes,
        max_header_bytes=server_args.max_header_bytes,
    )
    app.add_middleware(RequestIdMiddleware, ctx=ctx)

    auth = Depends(make_api_key_dependency(server_args.api_key))
    router = APIRouter(dependencies=[auth])
    chat = ChatServing(ctx)
    completion = CompletionServing(ctx)

    def warn_extra(body: OpenAIBase) -> None:
        """At most one log line per request (see request_fields.check_extra_fields)."""
        check_extra_fields(body.model_extra, isinstance(body, ChatCompletionRequest), warn_once)

    def admit() -> None:
        """Refuse at once when the queue is full, before template and tokenizer work."""
        reason = ctx.would_reject()
        if reason:
            raise queue_full(reason)

    @app.get("/health")
    async def health() -> Response:
        """Liveness: 200 while the engine is alive, draining included."""
        failure = liveness_failure(ctx.engine, server_args.health_stall_timeout)
        return Response(status_code=200) if failure is None else failure.response()

    @app.get("/ready")
    async def ready() -> Response:
        """Readiness: 200 only when loaded, alive and not draining; else 503 with a reason."""
        failure = readiness_failure(
            ctx.engine, server_args.health_stall_timeout, ctx.inflight.draining
        )
        return probe_response(failure, {"status": "ready"})

    @router.get("/version")
    async def version() -> dict[str, str]:
        return {"version": engine.__version__}

    def model_card(name: str) -> ModelCard:
        adapter = ctx.lora.get(name) if ctx.lora is not None else None
        if adapter is not None and ctx.lora is not None:  # vLLM: root = path, parent = base
            return ModelCard(
                id=name,
                root=adapter.lora_path,
                parent=ctx.lora.parent(name),
                max_model_len=ctx.max_model_len,
            )
        return ModelCard(id=name, root=ctx.served_model_names[0], max_model_len=ctx.max_model_len)

    @router.get("/v1/models")
    async def models() -> ModelList:
        """The base model's names, then the LoRA adapters (with ``parent``)."""
        return ModelList(data=[model_card(name) for name in ctx.model_names()])

    @router.get("/v1/models/{model_id:path}")
    async def model(model_id: str) -> ModelCard:
        """One model's card (the id may be a path, as vLLM's default served name is)."""
        if model_id not in ctx.model_names():
            raise model_not_found(model_id, ctx.model_names())
        return model_card(model_id)

    @router.post("/v1/chat/completions", response_model=None)
    async def chat_completions(body: ChatCompletionRequest, request: Request) -> Response:
        warn_extra(body)
        validate_chat_request(body, limits)
        require_task(ctx, "generate")
        admit()
        ctx.metrics.count_request("chat")
        return await chat.create(body, request)

    @router.post("/v1/completions", response_model=None)
    async def completions(body: CompletionRequest, request: Request) -> Response:
        warn_extra(body)
        validate_completion_request(body, limits)
        require_task(ctx, "generate")
        admit()
        ctx.metrics.count_request("completion")
        return await completion.create(body, request)

    add_responses_routes(
        router, ctx, chat, server_args.responses_store_size, admit, warn_extra,
        lambda chat_req: validate_chat_request(chat_req, limits),
    )  # fmt: skip
    add_embedding_routes(router, ctx, admit, warn_extra)
    if server_args.allow_runtime_lora_updating:
        from engine.entrypoints.openai.lora_routes import add_lora_routes

        add_lora_routes(router, ctx)

    @router.post("/tokenize")
    async def tokenize(body: TokenizeRequest) -> TokenizeResponse:
        ctx.resolve_model(body.model)
        if (body.prompt is None) == (body.messages is None):
            raise APIError("Send exactly one of prompt or messages.", 400, "prompt")
        if body.messages is not None:
            validate_messages(body.messages)
            validate_template_kwargs(body.chat_template_kwargs, limits.reserved_template_kwargs)
            num_chars, param = chat_text_chars(body.messages), "messages"
        else:
            num_chars, param = len(body.prompt or ""), "prompt"
        assert limits.max_prompt_chars is not None
        check_prompt_chars(num_chars, limits.max_prompt_chars, ctx.max_model_len, param)
        ids = await ctx.run_prepare(_tokenize_body, ctx, body)
        return TokenizeResponse(tokens=ids, count=len(ids), max_model_len=ctx.max_model_len)

    @router.post("/detokenize")
    async def detokenize(body: DetokenizeRequest) -> DetokenizeResponse:
        ctx.resolve_model(body.model)
        if len(body.tokens) > ctx.max_model_len:
            raise APIError(
                f"tokens has {len(body.tokens)} ids; at most max_model_len "
                f"({ctx.max_model_len}) are accepted (no prompt or output is longer); send "
                "fewer",
                400,
                "tokens",
            )
        vocab_size = len(ctx.tokenizer)
        bad = next((t for t in body.tokens if not 0 <= t < vocab_size), None)
        if bad is not None:
            raise APIError(f"token id {bad} is out of range [0, {vocab_size})", 400, "tokens")
        text = await ctx.run_prepare(ctx.tokenizer.decode, body.tokens)
        return DetokenizeResponse(prompt=text)

    @router.get("/load")
    async def load() -> dict[str, Any]:
        stats = await scheduler_stats(ctx.engine)
        body = {
            "num_requests_running": stats.num_running,
            "num_requests_waiting": stats.num_waiting,
            "kv_cache_usage": stats.kv_cache_usage,
            "num_free_blocks": stats.num_free_blocks,
            "num_total_blocks": stats.num_total_blocks,
            "num_http_requests_in_flight": len(ctx.inflight),
            "num_requests_in_flight_by_kind": ctx.inflight.count_by_kind(),
        }
        engine_loads = ctx.engine.engine_loads()
        if len(engine_loads) > 1:  # --data-parallel-size > 1: each engine's own
            body["engines"] = engine_loads
        return body

    async def metrics() -> Response:
        return Response(ctx.metrics.render(), media_type=CONTENT_TYPE)

    if server_args.metrics_without_auth:
        app.add_api_route("/metrics", metrics, methods=["GET"])
    else:
        router.add_api_route("/metrics", metrics, methods=["GET"])
    app.include_router(router)
    return app


def _tokenize_body(ctx: ServingContext, body: TokenizeRequest) -> list[int]:
    if body.messages is not None:
        try:
            text = ctx.engine.apply_chat_template(
                messages_to_dicts(body.messages),
                add_generation_prompt=body.add_generation_prompt,
                chat_template_kwargs=body.chat_template_kwargs,
            )
        except (APIError, ValueError):
            raise
        except Exception as exc:
            raise APIError(f"Could not apply the chat template: {exc}", 400, "messages") from None
        return list(ctx.tokenizer.encode(text, add_special_tokens=False))
    return list(ctx.tokenizer.encode(body.prompt, add_special_tokens=body.add_special_tokens))


def describe_config(engine_args: Any, server_args: ServerArgs) -> str:
    """The resolved configuration as indented JSON (the API key masked)."""
    from dataclasses import asdict

    server = asdict(server_args)
    if server.get("api_key"):
        server["api_key"] = "***"
    return json.dumps({"engine": asdict(engine_args), "server": server}, indent=2, default=str)
