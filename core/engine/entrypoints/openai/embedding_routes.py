"""Mounts ``POST /v1/embeddings`` on the app's authenticated router."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from fastapi import APIRouter, Request

from engine.entrypoints.openai.serving_base import ServingContext
from engine.entrypoints.openai.serving_embeddings import (
    EmbeddingRequest,
    EmbeddingResponse,
    EmbeddingServing,
)


def add_embedding_routes(
    router: APIRouter,
    ctx: ServingContext,
    admit: Callable[[], None],
    warn_extra: Callable[[Any], None],
) -> EmbeddingServing:
    serving = EmbeddingServing(ctx)

    @router.post("/v1/embeddings")
    async def create_embeddings(body: EmbeddingRequest, request: Request) -> EmbeddingResponse:
        warn_extra(body)
        admit()
        ctx.metrics.count_request("embeddings")
        return await serving.create(body, request)

    return serving
