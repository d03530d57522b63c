"""``POST /v1/embeddings``: inputs -> one prefill-only engine request each -> vectors.

Each input (a string, or token ids) is its own engine request, all sent at once so the
scheduler batches them like any requests; the answer lists them in input order. The
vector is the engine's pooled one, truncated to ``dimensions`` (Matryoshka models only)
and L2-normalized (``normalize: false`` in ``extra_body`` keeps the raw pooled vector),
sent as floats or as base64 of little-endian float32 (``encoding_format``).
"""

from __future__ import annotations

import base64
import struct
from typing import Any, Literal

from fastapi import Request
from pydantic import BaseModel, Field

from engine.embedding_vectors import check_dimensions, finish_embedding
from engine.entrypoints.openai.errors import APIError
from engine.entrypoints.openai.protocol import OpenAIBase
from engine.entrypoints.openai.serving_base import (
    EngineStream,
    ServingContext,
    close_all,
    new_request_id,
    open_streams,
    until_disconnected,
)
from engine.fan_out import merge_outputs
from engine.sampling_params import SamplingParams
from engine.tokenization.input_processor import PreparedRequest

REQUEST_KIND = "embeddings"


class EmbeddingRequest(OpenAIBase):
    model: str | None = None
    input: str | list[str] | list[int] | list[list[int]]
    encoding_format: Literal["float", "base64"] = "float"
    dimensions: int | None = Field(default=None, ge=1)
    user: str | None = None
    # engine fields (extra_body)
    normalize: bool | None = None
    priority: int = 0


class EmbeddingData(BaseModel):
    object: Literal["embedding"] = "embedding"
    index: int
    embedding: list[float] | str


class EmbeddingUsage(BaseModel):
    prompt_tokens: int
    total_tokens: int


class EmbeddingResponse(BaseModel):
    object: Literal["list"] = "list"
    data: list[EmbeddingData]
    model: str
    usage: EmbeddingUsage


def require_task(ctx: ServingContext, task: str) -> None:
    """400 when the served model runs the other task (an embedder cannot chat, ...)."""
    pooling = ctx.engine.pooling
    if task == "embed" and pooling is None:
        raise APIError(
            "This model generates text and serves no embeddings; start the server with "
            "--task embed to embed with its body (a separate server from the chat one).",
            400,
            "model",
            "model_not_embedding",
        )
    if task == "generate" and pooling is not None:
        raise APIError(
            "This model is served as an embedding model (--task embed) and generates no "
            "text; use /v1/embeddings, or start the server with --task generate.",
            400,
            "model",
            "model_not_generative",
        )


def _prompts(value: str | list[str] | list[int] | list[list[int]]) -> list[Any]:
    if isinstance(value, str):
        return [value]
    if not value:
        raise APIError("input must not be empty", 400, "input")
    if all(isinstance(v, int) for v in value):
        return [{"prompt_token_ids": list(value)}]  # one prompt as token ids
    if all(isinstance(v, str) for v in value):
        return list(value)
    if all(isinstance(v, list) for v in value):
        if any(not v for v in value):
            raise APIError("input: every token-id list must be non-empty", 400, "input")
        return [{"prompt_token_ids": list(v)} for v in value if isinstance(v, list)]
    raise APIError(
        "input must be a string, a list of strings, a list of token ids or a list of "
        "token-id lists (not a mix)",
        400,
        "input",
    )


def _encode(vector: list[float], encoding_format: str) -> list[float] | str:
    if encoding_format == "float":
        return vector
    return base64.b64encode(struct.pack(f"<{len(vector)}f", *vector)).decode("ascii")


class EmbeddingServing:
    def __init__(self, ctx: ServingContext) -> None:
        self.ctx = ctx

    async def create(self, req: EmbeddingRequest, raw: Request) -> EmbeddingResponse:
        require_task(self.ctx, "embed")
        model = self.ctx.resolve_model(req.model)
        if self.ctx.lora_request_for(model) is not None:
            raise APIError(
                f"`{model}` is a LoRA adapter; adapters serve generation, not embeddings: "
                "send the base model's name",
                400,
                "model",
            )
        pooling = self.ctx.engine.pooling
        try:
            check_dimensions(pooling, req.dimensions)
        except ValueError as exc:
            raise APIError(str(exc), 400, "dimensions") from None
        prompts = _prompts(req.input)
        prepared = await self.ctx.run_prepare(
            self._prepare, new_request_id(raw), prompts, req.priority
        )
        streams = await open_streams(self.ctx, prepared, None, REQUEST_KIND)
        try:
            pooled = await until_disconnected(raw, self._collect(streams))
        finally:
            await close_all(streams)
        data = []
        num_tokens = 0
        for i, (vector, num_prompt) in enumerate(pooled):
            num_tokens += num_prompt
            vector = finish_embedding(vector, pooling, req.dimensions, req.normalize)
            data.append(EmbeddingData(index=i, embedding=_encode(vector, req.encoding_format)))
        usage = EmbeddingUsage(prompt_tokens=num_tokens, total_tokens=num_tokens)
        return EmbeddingResponse(data=data, model=model, usage=usage)

    def _prepare(self, request_id: str, prompts: list[Any], priority: int) -> list[PreparedRequest]:
        """The engine's front end: one prefill-only request per input (ids
        ``{request_id}-{i}`` for several)."""
        try:
            return self.ctx.engine.prepare(
                request_id, prompts, SamplingParams(max_tokens=1), priority
            )
        except ValueError as exc:  # RequestValidationError
            raise APIError(str(exc), 400) from None

    async def _collect(self, streams: list[EngineStream]) -> list[tuple[list[float], int]]:
        results: list[tuple[list[float], int] | None] = [None] * len(streams)
        tracker = self.ctx.metrics.request_tracker()
        async for i, out in merge_outputs(streams):
            if out.finished:
                if out.pooled is None:
                    raise APIError(
                        f"input {i} ended without an embedding ({out.error or 'aborted'})", 500
                    )
                results[i] = (out.pooled, len(out.prompt_token_ids))
                tracker.on_finish("stop", len(out.prompt_token_ids), 0)
        missing = [i for i, r in enumerate(results) if r is None]
        if missing:
            raise APIError(f"inputs {missing} ended without an embedding", 500)
        return [r for r in results if r is not None]
