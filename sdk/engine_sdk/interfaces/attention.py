"""The attention-backend contract: paged KV cache layout, per-step metadata, forward.

The engine owns the KV cache tensors and the block tables; a backend says how one layer's
cache is shaped, and computes attention for a flat batch of tokens from many requests.

A step's tokens are packed request after request::

    tokens:        [ r0 t0 t1 t2 | r1 t0 | r2 t0 t1 ]        num_tokens = 6
    query_start:   0             3       4          6     (num_seqs + 1 entries)
    seq_lens:      r0: 10        r1: 7   r2: 2            (cached context + new tokens)

Request ``i`` has ``seq_lens[i] - query_lens[i]`` tokens already in the cache (a cached
prefix, an earlier prefill chunk or earlier decode steps); its new tokens sit at positions
``seq_lens[i] - query_lens[i] ... seq_lens[i] - 1`` and attend causally to everything
before them. ``slot_mapping[t] = block_id * block_size + offset`` is where token ``t``'s
K and V are written; ``block_tables[i, j]`` is the j-th block of request ``i``.

An fp8 KV cache (``--kv-cache-dtype fp8``) stores K and V quantized with one scale per
layer for K and one for V: ``stored = fp8(clamp(x / scale, -max, max))`` on write,
``real = float(stored) * scale`` on read. The scales live in ``AttentionBackend.kv_scales``
(float32 ``[k_scale, v_scale]`` on the model's device), 1.0 unless the checkpoint provides
them; they are changed in place only, so captured CUDA graphs keep reading the right ones.
"""

from __future__ import annotations

import math
from abc import ABC, abstractmethod
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, ClassVar

if TYPE_CHECKING:
    import torch

# ``--kv-cache-dtype`` values other than ``auto`` (the model dtype) -> torch dtype name.
FP8_KV_CACHE_DTYPES: dict[str, str] = {
    "fp8": "float8_e4m3fn",
    "fp8_e4m3": "float8_e4m3fn",
    "fp8_e5m2": "float8_e5m2",
}


@dataclass(frozen=True)
class AttentionLayerConfig:
    """The shape of one attention layer, fixed at model build time."""

    num_heads: int
    num_kv_heads: int
    head_dim: int
    scale: float
    block_size: int
    dtype: torch.dtype
    kv_cache_dtype: str = "auto"
    sliding_window: int | None = None
    # Gemma 2: scores become ``cap * tanh(scores / cap)`` (after ``scale``) before softmax.
    # A backend that cannot apply it raises ``ValueError`` naming ``logits_soft_cap``.
    logits_soft_cap: float | None = None


@dataclass
class AttentionBatch:
    """One step's attention inputs, already on the model's device.

    ``query_start_loc`` int32 [num_seqs + 1], ``seq_lens`` int32 [num_seqs],
    ``block_tables`` int32 [num_seqs, max_blocks_per_seq] (padded with 0),
    ``slot_mapping`` int64 [num_tokens] (-1 for padding tokens that write nothing).
    The host copies (``*_cpu``) let reference backends loop without syncing.
    """

    query_start_loc: torch.Tensor
    seq_lens: torch.Tensor
    block_tables: torch.Tensor
    slot_mapping: torch.Tensor
    max_query_len: int
    max_seq_len: int
    num_seqs: int
    num_tokens: int
    query_start_loc_cpu: list[int]
    seq_lens_cpu: list[int]

    @property
    def is_decode_only(self) -> bool:
        return self.max_query_len == 1


@dataclass(frozen=True)
class KVStoreTarget:
    """Where a caller writes a step's K and V itself (a fused kernel that has them in
    registers), for a backend that offers it (``AttentionBackend.kv_store_target``).

    ``k_cache``/``v_cache`` are ``[num_blocks, block_size, num_kv_heads, head_dim]`` with
    contiguous slots: token ``t``'s head ``h`` goes to ``cache.view(-1, num_kv_heads,
    head_dim)[slot_mapping[t], h]`` (``slot_mapping[t] < 0``: nowhere). An fp8 cache stores
    ``fp8(clamp(x / scale, -max, max))`` with ``kv_scales`` ``[k_scale, v_scale]``.
    """

    k_cache: torch.Tensor
    v_cache: torch.Tensor
    slot_mapping: torch.Tensor
    kv_scales: torch.Tensor


class AttentionBackend(ABC):
    """Computes paged attention for one layer.

    The engine creates one instance per attention layer through the model, calls
    ``build_metadata`` once per step (on the first layer's backend; the result is shared by
    all layers) and ``forward`` once per layer per step.
    """

    name: ClassVar[str] = ""
    # True when ``build_metadata`` and ``forward`` do no host work that depends on the
    # step (no reads of the ``*_cpu`` lists, no syncs), so decode steps can be captured
    # in CUDA graphs and replayed with new inputs in the same buffers.
    supports_cuda_graphs: ClassVar[bool] = False

    def __init__(self, config: AttentionLayerConfig) -> None:
        import torch

        self.config = config
        # fp8 KV cache scales [k_scale, v_scale]; built under the engine's torch.device
        # context, so on the model's device. Unused unless the cache tensor is fp8.
        self.kv_scales: torch.Tensor = torch.ones(2, dtype=torch.float32)

    def set_kv_scales(self, k_scale: float | None = None, v_scale: float | None = None) -> None:
        """Set this layer's fp8 KV cache scales in place (``None`` keeps the current one)."""
        for index, (which, value) in enumerate((("k_scale", k_scale), ("v_scale", v_scale))):
            if value is None:
                continue
            if not (math.isfinite(value) and value > 0):
                raise ValueError(
                    f"{which} of an fp8 KV cache must be a positive finite number, got {value}"
                )
            self.kv_scales[index] = float(value)

    @staticmethod
    def kv_cache_shape(
        num_blocks: int, block_size: int, num_kv_heads: int, head_dim: int
    ) -> tuple[int, ...]:
        """Shape of one layer's cache tensor. Default: K and V stacked first."""
        return (2, num_blocks, block_size, num_kv_heads, head_dim)

    def build_metadata(self, batch: AttentionBatch) -> Any:
        """Turn the step's batch into whatever ``forward`` wants (default: the batch)."""
        return batch

    @abstractmethod
    def forward(
        self,
        query: torch.Tensor,
        key: torch.Tensor,
        value: torch.Tensor,
        kv_cache: torch.Tensor,
        metadata: Any,
    ) -> torch.Tensor:
        """Write ``key``/``value`` into ``kv_cache`` at the slots, then attend.

        ``query`` is [num_tokens, num_heads, head_dim]; ``key`` and ``value`` are
        [num_tokens, num_kv_heads, head_dim]. Returns [num_tokens, num_heads * head_dim].
        """

    def kv_store_target(self, kv_cache: torch.Tensor, metadata: Any) -> KVStoreTarget | None:
        """Where a caller may write this step's K/V itself before calling
        ``forward_stored`` instead of ``forward`` (one launch less a layer); ``None``
        (the default): the caller passes them to ``forward``."""
        return None

    def forward_stored(
        self, query: torch.Tensor, kv_cache: torch.Tensor, metadata: Any
    ) -> torch.Tensor:
        """``forward`` for a step whose K/V the caller already wrote where
        ``kv_store_target`` said; only called on backends that returned a target."""
        raise NotImplementedError(
            f"{type(self).__name__} returns a kv_store_target but has no forward_stored"
        )
