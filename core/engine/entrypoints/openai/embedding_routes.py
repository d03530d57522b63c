"""Mounts the embedding-model routes on the app's authenticated router:
``/v1/embeddings``, and ``/v1/score`` (also ``/score``) and ``/rerank`` (also ``/v1/rerank``,
``/v2/rerank``) scored with embeddings."""

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
from engine.entrypoints.openai.serving_score import (
    RerankRequest,
    RerankResponse,
    ScoreRequest,
    ScoreResponse,
    ScoreServing,
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

    scoring = ScoreServing(serving)

    async def score(body: ScoreRequest, request: Request) -> ScoreResponse:
        warn_extra(body)
        admit()
        ctx.metrics.count_request("score")
        return await scoring.score(body, request)

    async def rerank(body: RerankRequest, request: Request) -> RerankResponse:
        warn_extra(body)
        admit()
        ctx.metrics.count_request("rerank")
        return await scoring.rerank(body, request)

    for path in ("/v1/score", "/score"):
        router.add_api_route(path, score, methods=["POST"])
    for path in ("/rerank", "/v1/rerank", "/v2/rerank"):
        router.add_api_route(path, rerank, methods=["POST"])
    return serving
