"""One KV cache block: its id, reference count, prefix-cache hash and free-list links."""

from __future__ import annotations

from dataclasses import dataclass

from engine.core.kv_cache.block_hash import BlockHash


@dataclass(eq=False, slots=True)
class KVCacheBlock:
    """A block of ``block_size`` token slots in the runner's KV tensors.

    ``ref_cnt`` counts the requests whose block table holds the block. A block with
    ``ref_cnt == 0`` sits in the free queue; if it still has a ``block_hash`` its contents are
    a valid cached prefix block that a later request may revive until it is evicted.
    """

    block_id: int
    ref_cnt: int = 0
    block_hash: BlockHash | None = None
    # Links of the doubly linked free queue (None while the block is not in the queue).
    prev_free: KVCacheBlock | None = None
    next_free: KVCacheBlock | None = None

    def __repr__(self) -> str:
        cached = "cached" if self.block_hash is not None else "uncached"
        return f"KVCacheBlock(id={self.block_id}, ref_cnt={self.ref_cnt}, {cached})"
