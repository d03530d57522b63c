"""Settings of the KV cache block pool (``KVCacheConfig``)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from engine.core.kv_cache.block_hash import HASH_ALGOS

if TYPE_CHECKING:
    from engine.config import EngineArgs


@dataclass(frozen=True)
class KVCacheConfig:
    """``num_blocks`` counts every block of the runner's KV tensors, including block 0, which
    the pool reserves as the null (padding) block: ``num_blocks - 1`` blocks are usable."""

    num_blocks: int
    block_size: int
    enable_prefix_caching: bool = True
    hash_algo: str = "sha256"  # --prefix-caching-hash-algo: sha256 | xxhash

    def __post_init__(self) -> None:
        if self.block_size < 1:
            raise ValueError(f"--block-size must be at least 1, got {self.block_size}")
        if self.num_blocks < 2:
            raise ValueError(
                f"the KV cache has {self.num_blocks} block(s) but needs at least 2 (block 0 "
                "is the reserved null block); raise --gpu-memory-utilization or "
                "--kv-cache-memory-bytes, or lower --block-size"
            )
        if self.hash_algo not in HASH_ALGOS:
            raise ValueError(
                f"--prefix-caching-hash-algo must be one of {', '.join(HASH_ALGOS)}; "
                f"got {self.hash_algo!r}"
            )

    @property
    def num_usable_blocks(self) -> int:
        return self.num_blocks - 1

    @classmethod
    def from_engine_args(cls, args: EngineArgs, num_blocks: int, block_size: int) -> KVCacheConfig:
        """``num_blocks`` / ``block_size`` are the runner's (planned from memory)."""
        return cls(
            num_blocks=num_blocks,
            block_size=block_size,
            enable_prefix_caching=args.enable_prefix_caching,
            hash_algo=args.prefix_caching_hash_algo,
        )
