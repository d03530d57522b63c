"""Token embedding and LM head (optionally tied to the embedding)."""

from __future__ import annotations

import torch

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
        return torch.nn.functional.linear(hidden_states, self.weight).float()
