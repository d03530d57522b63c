"""Token embedding and LM head (optionally tied to the embedding)."""

from __future__ import annotations

import functools
import os

import torch

from engine_sdk.layers import gemv

__all__ = ["LMHead", "VocabEmbedding"]


class VocabEmbedding(torch.nn.Module):
    """``weight`` [vocab_size, hidden_size], looked up by token id."""

    def __init__(self, vocab_size: int, hidden_size: int, dtype: torch.dtype | None = None):
        super().__init__()
        self.vocab_size = vocab_size
        weight = torch.empty(vocab_size, hidden_size, dtype=dtype)
        self.weight = torch.nn.Parameter(weight, requires_grad=False)

    def forward(self, input_ids: torch.Tensor) -> torch.Tensor:
        return torch.nn.functional.embedding(input_ids, self.weight)


class LMHead(torch.nn.Module):
    """Hidden states -> float32 logits. ``tie(embedding)`` shares the embedding's weight.

    A tied head has no parameter of its own, so ``named_parameters`` lists the shared
    tensor once (under the embedding's name) and the checkpoint need not hold
    ``lm_head.weight``.
    """

    def __init__(self, vocab_size: int, hidden_size: int, dtype: torch.dtype | None = None):
        super().__init__()
        self.vocab_size = vocab_size
        weight = torch.empty(vocab_size, hidden_size, dtype=dtype)
        self.weight = torch.nn.Parameter(weight, requires_grad=False)
        self.tied = False

    def tie(self, embedding: VocabEmbedding) -> None:
        self.weight = embedding.weight
        self.tied = True

    def forward(self, hidden_states: torch.Tensor) -> torch.Tensor:
        if lm_head_gemv() and gemv.use_gemv(hidden_states, self.weight):
            # decode at one row: the GEMV writes the float32 logits (rounded to the
            # weight's dtype first, as below) in its one launch
            return gemv.gemv(hidden_states, self.weight, out_dtype=torch.float32)
        return torch.nn.functional.linear(hidden_states, self.weight).float()


@functools.lru_cache(maxsize=1)
def lm_head_gemv() -> bool:
    """``ENGINE_GEMV_LM_HEAD=1``: the LM head takes the small-batch GEMV where the
    projections do. Off by default: W2 on an H100 was 1.05 ms a token with it, within
    the 1.03-1.06 of two default runs in the same call (2026-12-06). Read once;
    ``cache_clear`` for tests."""
    return os.environ.get("ENGINE_GEMV_LM_HEAD", "0") == "1"
