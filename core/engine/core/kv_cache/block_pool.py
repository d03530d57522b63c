"""The block pool: every KV block, the free queue, reference counts and the prefix cache map.

Block 0 is reserved as the null block: the runner pads block tables with 0 and may write
padding tokens' KV there, so it is never handed to a request. Blocks ``1 .. num_blocks-1``
start in the free queue in id order.

A freed block keeps its hash (it stays findable in ``cached_blocks``) until allocation
pops it from the head of the free queue, which evicts it: least recently freed first.
"""

from __future__ import annotations

from collections.abc import Iterable

from engine.core.kv_cache.block_hash import BlockHash
from engine.core.kv_cache.free_block_queue import FreeBlockQueue
from engine.core.kv_cache.kv_cache_block import KVCacheBlock

NULL_BLOCK_ID = 0


class BlockPool:
    def __init__(self, num_blocks: int, enable_prefix_caching: bool = True) -> None:
        assert num_blocks >= 2, "the pool needs the null block and at least one usable block"
        self.num_blocks = num_blocks
        self.enable_prefix_caching = enable_prefix_caching
        self.blocks = [KVCacheBlock(block_id=i) for i in range(num_blocks)]
        self.null_block = self.blocks[NULL_BLOCK_ID]
        self.null_block.ref_cnt = 1  # never freed, never allocated
        self.free_queue = FreeBlockQueue(self.blocks[1:])
        self.cached_blocks: dict[BlockHash, KVCacheBlock] = {}

    @property
    def num_usable_blocks(self) -> int:
        return self.num_blocks - 1

    @property
    def num_free_blocks(self) -> int:
        """Blocks allocation may take, cached-but-unreferenced ones included."""
        return self.free_queue.num_free_blocks

    @property
    def usage(self) -> float:
        """Fraction of usable blocks referenced by at least one request."""
        return 1.0 - self.num_free_blocks / self.num_usable_blocks

    def get_cached_block(self, block_hash: BlockHash) -> KVCacheBlock | None:
        return self.cached_blocks.get(block_hash)

    def get_new_blocks(self, num_blocks: int) -> list[KVCacheBlock]:
        """Pop ``num_blocks`` from the head of the free queue, evicting their cached hashes."""
        if num_blocks > self.num_free_blocks:
            raise ValueError(
                f"asked for {num_blocks} KV blocks but only {self.num_free_blocks} are free"
            )
        new_blocks = []
        for _ in range(num_blocks):
            block = self.free_queue.popleft()
            self._evict(block)
            assert block.ref_cnt == 0, f"{block} was in the free queue while referenced"
            block.ref_cnt = 1
            new_blocks.append(block)
        return new_blocks

    def touch(self, blocks: Iterable[KVCacheBlock]) -> None:
        """Take a reference on prefix-cache hits, reviving free ones out of the free queue."""
        for block in blocks:
            if block.ref_cnt == 0:
                self.free_queue.remove(block)
            block.ref_cnt += 1

    def free_blocks(self, ordered_blocks: Iterable[KVCacheBlock]) -> None:
        """Drop one reference each; blocks reaching zero join the tail of the free queue in
        the given order (callers pass a request's blocks last-first, so a sequence's tail is
        evicted before its shared head)."""
        for block in ordered_blocks:
            assert block.ref_cnt > 0 and block is not self.null_block, f"double free of {block}"
            block.ref_cnt -= 1
            if block.ref_cnt == 0:
                self.free_queue.append(block)

    def cache_block(self, block: KVCacheBlock, block_hash: BlockHash) -> None:
        """Register a full, computed block under its hash. If another block already holds the
        hash (two requests computed the same prefix at once), this one stays uncached."""
        if not self.enable_prefix_caching or block.block_hash is not None:
            return
        if block_hash in self.cached_blocks:
            return
        block.block_hash = block_hash
        self.cached_blocks[block_hash] = block

    def _evict(self, block: KVCacheBlock) -> None:
        if block.block_hash is None:
            return
        cached = self.cached_blocks.pop(block.block_hash, None)
        assert cached is block, f"hash map and {block} disagree"
        block.block_hash = None

    def reset_prefix_cache(self) -> bool:
        """Forget every cached hash; only possible while no block is referenced."""
        if self.num_free_blocks != self.num_usable_blocks:
            return False
        for block in self.cached_blocks.values():
            block.block_hash = None
        self.cached_blocks.clear()
        return True
