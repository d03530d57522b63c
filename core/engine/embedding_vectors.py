"""A pooled vector -> the embedding a caller gets: Matryoshka truncation, then L2 norm.

Shared by ``LLM.embed`` and ``POST /v1/embeddings``. ``dimensions`` keeps the first N
components (only where the model declares Matryoshka training, else a ``ValueError``
that says so); normalization comes after truncation, so a truncated vector is unit length.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from engine.model_executor.pooling_task import PoolingConfig


@dataclass
class EmbeddingOutput:
    """One prompt's embedding (``LLM.embed``)."""

    request_id: str
    prompt_token_ids: list[int]
    embedding: list[float]


def check_dimensions(pooling: PoolingConfig, dimensions: int | None) -> None:
    """``ValueError`` when ``dimensions`` cannot be served by this model."""
    if dimensions is None or dimensions == pooling.embedding_size:
        return
    allowed = pooling.matryoshka_dimensions
    if allowed is None:
        raise ValueError(
            f"dimensions {dimensions}: this model does not declare Matryoshka embeddings "
            f"(config matryoshka_dimensions or is_matryoshka), so its embeddings have "
            f"{pooling.embedding_size} dimensions only; leave dimensions out"
        )
    if allowed and dimensions not in allowed:
        raise ValueError(
            f"dimensions {dimensions} is not one of the model's Matryoshka dimensions "
            f"{list(allowed)}"
        )
    if not 1 <= dimensions <= pooling.embedding_size:
        raise ValueError(
            f"dimensions must be between 1 and {pooling.embedding_size}, got {dimensions}"
        )


def finish_embedding(
    vector: list[float], pooling: PoolingConfig, dimensions: int | None = None,
    normalize: bool | None = None,
) -> list[float]:  # fmt: skip
    """Truncate to ``dimensions`` (checked first) and L2-normalize unless told not to."""
    check_dimensions(pooling, dimensions)
    out = vector[:dimensions] if dimensions is not None else list(vector)
    if pooling.normalize if normalize is None else normalize:
        norm = math.sqrt(sum(x * x for x in out))
        if norm > 0:
            out = [x / norm for x in out]
    return out
