"""The pooling-model contract: a model whose output is one vector per prompt.

A ``PoolingModel`` runs the same steps as a ``ModelArchitecture`` (``forward`` over a flat
batch of prompt tokens, returning the final hidden states) but is never sampled from: the
engine pools each prompt's hidden states (``last`` token or ``mean``, over the prompt's
chunks) into its embedding. Register one with ``register_pooling_models`` and a
``PoolingModelSpec``.
"""

from __future__ import annotations

import torch

from engine_sdk.interfaces.model import ModelArchitecture


class PoolingModel(ModelArchitecture):
    """Base class of every pooling model; ``forward`` returns [num_tokens, hidden]."""

    def compute_logits(self, hidden_states: torch.Tensor) -> torch.Tensor:
        """A pooling model has no vocabulary head; the engine never samples from it (the
        hidden states pass through, so memory profiling can still run a step)."""
        return hidden_states.float()

    def embedding_size(self) -> int:
        """Length of the pooled vector (the hidden size unless a subclass projects it)."""
        return int(self.ctx.hf_config.hidden_size)
