"""The model-architecture contract: build from an HF config, load weights, run a step."""

from __future__ import annotations

from abc import abstractmethod
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, ClassVar

import torch

from engine_sdk.deprecation import deprecated_members, warn_deprecated_members
from engine_sdk.interfaces.attention import AttentionBackend, AttentionLayerConfig

if TYPE_CHECKING:
    from engine_sdk.interfaces.quantization import QuantizationConfig


@dataclass
class ModelContext:
    """What the engine hands a model when building it.

    ``hf_config`` is a ``transformers.PretrainedConfig`` (from config.json or built by a
    format plugin such as GGUF). ``make_attention`` builds the chosen backend for one layer.
    ``quant_config`` is set when the checkpoint or ``--quantization`` asks for one; layers
    ask it for a per-layer method by prefix (``model.layers.0.self_attn.q_proj``).
    """

    hf_config: Any
    dtype: torch.dtype
    device: torch.device
    block_size: int
    make_attention: Callable[[AttentionLayerConfig], AttentionBackend]
    quant_config: QuantizationConfig | None = None
    kv_cache_dtype: str = "auto"


_DEPRECATED_MEMBERS = deprecated_members("engine_sdk.interfaces.model:ModelArchitecture")


class ModelArchitecture(torch.nn.Module):
    """Base class of every model a plugin provides.

    ``forward`` runs one engine step over a flat batch of tokens (see
    ``engine_sdk.interfaces.attention`` for the packing) and returns the final hidden
    states; ``compute_logits`` maps selected hidden states to vocabulary logits, so the
    engine computes logits only for positions it samples from.
    """

    #: Deprecated since engine-sdk 0.1.1, removed in 0.2: the HF architecture names are
    #: declared once, in ``ModelArchitectureSpec.architectures``.
    architectures: ClassVar[tuple[str, ...]] = ()
    #: True when the model shards its weights over a tensor-parallel group
    #: (``--tensor-parallel-size`` > 1); the core refuses TP for models that leave it False.
    supports_tensor_parallel: ClassVar[bool] = False

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        warn_deprecated_members(cls, _DEPRECATED_MEMBERS)

    def __init__(self, ctx: ModelContext) -> None:
        super().__init__()
        self.ctx = ctx

    @abstractmethod
    def forward(
        self,
        input_ids: torch.Tensor,
        positions: torch.Tensor,
        kv_caches: list[torch.Tensor],
        attn_metadata: Any,
    ) -> torch.Tensor:
        """``input_ids`` and ``positions`` are int64 [num_tokens]; returns [num_tokens, hidden]."""

    @abstractmethod
    def compute_logits(self, hidden_states: torch.Tensor) -> torch.Tensor:
        """[n, hidden] -> float32 [n, vocab_size]."""

    @abstractmethod
    def load_weights(self, weights: Iterable[tuple[str, torch.Tensor]]) -> set[str]:
        """Consume (HF name, tensor) pairs; return the parameter names that were filled."""

    def num_attention_layers(self) -> int:
        """How many KV caches the engine allocates (one per attention layer)."""
        return int(self.ctx.hf_config.num_hidden_layers)
