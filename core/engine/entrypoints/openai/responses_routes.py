"""Mounts the Responses API routes on the app's authenticated router."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from fastapi import APIRouter, Request
from fastapi.responses import Response

from engine.entrypoints.openai.protocol import ChatCompletionRequest
from engine.entrypoints.openai.responses_protocol import ResponsesRequest
from engine.entrypoints.openai.responses_store import ResponseStore
from engine.entrypoints.openai.serving_base import ServingContext
from engine.entrypoints.openai.serving_chat import ChatServing
from engine.entrypoints.openai.serving_embeddings import require_task
from engine.entrypoints.openai.serving_responses import ResponsesServing


def add_responses_routes(
    router: APIRouter,
    ctx: ServingContext,
    chat: ChatServing,
    store_size: int,
    admit: Callable[[], None],
    warn_extra: Callable[[Any], None],
    validate: Callable[[ChatCompletionRequest], None] | None = None,
) -> ResponsesServing:
    serving = ResponsesServing(ctx, chat, ResponseStore(store_size), validate)

    @router.post("/v1/responses", response_model=None)
    async def create_response(body: ResponsesRequest, request: Request) -> Response:
        warn_extra(body)
        require_task(ctx, "generate")
        admit()
        ctx.metrics.count_request("responses")
        return await serving.create(body, request)

    @router.get("/v1/responses/{response_id}")
    async def retrieve_response(response_id: str) -> dict[str, Any]:
        return serving.retrieve(response_id)

    @router.post("/v1/responses/{response_id}/cancel")
    async def cancel_response(response_id: str) -> dict[str, Any]:
        return await serving.cancel(response_id)

    return serving
