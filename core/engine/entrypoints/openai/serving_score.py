"""``POST /v1/score`` and ``POST /rerank`` on an embedding model (bi-encoder scoring).

The request and response shapes are vLLM's (Jina / Cohere compatible for rerank). Each
text is embedded once (``EmbeddingServing``, so the same prefill-only engine requests) and
a pair's score is the cosine similarity of the two normalized embeddings. A cross-encoder
(query and document read together, scored by a classification head) would score better;
no pooling model of this engine has one yet (docs/serving.md).

Pairs for ``/v1/score``: ``text_1`` one text and ``text_2`` a list (1-to-N), or two lists
of the same length (pairwise).
"""

from __future__ import annotations

import time
import uuid
from typing import Any, Literal

from fastapi import Request
from pydantic import BaseModel, Field

from engine.entrypoints.openai.errors import APIError
from engine.entrypoints.openai.protocol import OpenAIBase
from engine.entrypoints.openai.serving_embeddings import (
    EmbeddingRequest,
    EmbeddingServing,
    require_task,
)


class ScoreRequest(OpenAIBase):
    model: str | None = None
    text_1: str | list[str]
    text_2: str | list[str]
    priority: int = 0


class ScoreData(BaseModel):
    index: int
    object: Literal["score"] = "score"
    score: float


class ScoreUsage(BaseModel):
    prompt_tokens: int
    total_tokens: int


class ScoreResponse(BaseModel):
    id: str
    object: Literal["list"] = "list"
    created: int = Field(default_factory=lambda: int(time.time()))
    model: str
    data: list[ScoreData]
    usage: ScoreUsage


class RerankRequest(OpenAIBase):
    model: str | None = None
    query: str
    documents: list[str] = Field(min_length=1)
    top_n: int = Field(default=0, ge=0)  # 0: all documents
    priority: int = 0


class RerankDocument(BaseModel):
    text: str


class RerankResult(BaseModel):
    index: int
    document: RerankDocument
    relevance_score: float


class RerankUsage(BaseModel):
    total_tokens: int


class RerankResponse(BaseModel):
    id: str
    model: str
    usage: RerankUsage
    results: list[RerankResult]


def score_pairs(text_1: str | list[str], text_2: str | list[str]) -> list[tuple[str, str]]:
    """The (text_1, text_2) pairs a score request asks for; 400 for lists that do not pair."""
    firsts = [text_1] if isinstance(text_1, str) else list(text_1)
    seconds = [text_2] if isinstance(text_2, str) else list(text_2)
    if not firsts or not seconds:
        raise APIError("text_1 and text_2 must not be empty", 400, "text_1")
    if len(firsts) == 1:
        return [(firsts[0], t) for t in seconds]
    if len(firsts) != len(seconds):
        raise APIError(
            f"text_1 has {len(firsts)} texts and text_2 {len(seconds)}: send one text_1 "
            "(scored against every text_2) or two lists of the same length (scored pairwise)",
            400,
            "text_2",
        )
    return list(zip(firsts, seconds, strict=True))


class ScoreServing:
    def __init__(self, embeddings: EmbeddingServing) -> None:
        self.embeddings = embeddings

    async def _similarities(
        self, model: str | None, pairs: list[tuple[str, str]], priority: int, raw: Request
    ) -> tuple[list[float], int, str]:
        """Cosine similarity per pair (each distinct text embedded once), prompt tokens."""
        require_task(self.embeddings.ctx, "embed")
        texts = list(dict.fromkeys(t for pair in pairs for t in pair))
        body = EmbeddingRequest(model=model, input=texts, priority=priority, normalize=True)
        answer = await self.embeddings.create(body, raw)
        vectors: dict[str, Any] = {
            text: item.embedding for text, item in zip(texts, answer.data, strict=True)
        }
        scores = [
            float(sum(x * y for x, y in zip(vectors[a], vectors[b], strict=True))) for a, b in pairs
        ]
        return scores, answer.usage.prompt_tokens, answer.model

    async def score(self, req: ScoreRequest, raw: Request) -> ScoreResponse:
        pairs = score_pairs(req.text_1, req.text_2)
        scores, num_tokens, model = await self._similarities(req.model, pairs, req.priority, raw)
        return ScoreResponse(
            id=f"score-{uuid.uuid4().hex}",
            model=model,
            data=[ScoreData(index=i, score=s) for i, s in enumerate(scores)],
            usage=ScoreUsage(prompt_tokens=num_tokens, total_tokens=num_tokens),
        )

    async def rerank(self, req: RerankRequest, raw: Request) -> RerankResponse:
        pairs = [(req.query, doc) for doc in req.documents]
        scores, num_tokens, model = await self._similarities(req.model, pairs, req.priority, raw)
        order = sorted(range(len(scores)), key=lambda i: scores[i], reverse=True)
        if req.top_n:
            order = order[: req.top_n]
        results = [
            RerankResult(
                index=i, document=RerankDocument(text=req.documents[i]), relevance_score=scores[i]
            )
            for i in order
        ]
        return RerankResponse(
            id=f"rerank-{uuid.uuid4().hex}",
            model=model,
            usage=RerankUsage(total_tokens=num_tokens),
            results=results,
        )
