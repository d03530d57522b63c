"""A request to an embedding model: prefill-only, one step past its prompt, nothing kept.

Whatever sampling parameters a caller passed, a pooling request runs with ``max_tokens``
1 (the step that completes its prompt ends it and frees its KV blocks) and no sampling
features. With mean pooling every prompt token's hidden state must be computed, so the
request gets a cache salt of its own: prefix-cache hits would skip rows of the mean (its
blocks still enter the cache, and are evicted first-in as any freed block). Last-token
pooling keeps the caller's salt: the last token is always computed, over cached KV.
"""

from __future__ import annotations

import uuid

from engine.model_executor.pooling_task import PoolingConfig
from engine.sampling_params import SamplingParams


def pooling_request(
    pooling: PoolingConfig, cache_salt: str | None
) -> tuple[SamplingParams, str | None]:
    """The sampling parameters and cache salt a pooling request runs with."""
    params = SamplingParams(max_tokens=1, temperature=0.0)
    if pooling.pooling == "mean":
        cache_salt = f"pool-{uuid.uuid4().hex}"
    return params, cache_salt
