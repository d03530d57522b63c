"""Block pool and free queue: null block, O(1) middle removal, LRU eviction order."""

from __future__ import annotations

import pytest
from engine.core.kv_cache import NULL_BLOCK_ID, BlockHash, BlockPool
from engine.core.kv_cache.free_block_queue import FreeBlockQueue
from engine.core.kv_cache.kv_cache_block import KVCacheBlock


def test_free_queue_popleft_remove_append() -> None:
    blocks = [KVCacheBlock(i) for i in range(5)]
    queue = FreeBlockQueue(blocks)
    assert queue.block_ids() == [0, 1, 2, 3, 4]
    assert queue.popleft() is blocks[0]
    queue.remove(blocks[2])  # from the middle
    queue.remove(blocks[4])  # the last one
    assert queue.block_ids() == [1, 3]
    queue.append(blocks[2])
    queue.append(blocks[0])
    assert queue.block_ids() == [1, 3, 2, 0]
    assert len(queue) == 4
    for expected in (1, 3, 2, 0):
        assert queue.popleft().block_id == expected
    with pytest.raises(ValueError, match="no free blocks"):
        queue.popleft()


def test_null_block_is_reserved() -> None:
    pool = BlockPool(num_blocks=4)
    assert pool.num_usable_blocks == pool.num_free_blocks == 3
    blocks = pool.get_new_blocks(3)
    assert [b.block_id for b in blocks] == [1, 2, 3]
    assert NULL_BLOCK_ID not in [b.block_id for b in blocks]
    assert pool.usage == 1.0
    with pytest.raises(ValueError, match="only 0 are free"):
        pool.get_new_blocks(1)


def test_freed_cached_blocks_are_evicted_lru_tail_first() -> None:
    pool = BlockPool(num_blocks=7)  # usable 1..6
    a = pool.get_new_blocks(3)  # 1, 2, 3
    for i, block in enumerate(a):
        pool.cache_block(block, BlockHash(bytes([i])))
    b = pool.get_new_blocks(1)  # 4
    pool.free_blocks(reversed(a))  # sequence tail first: 3, 2, 1
    assert pool.free_queue.block_ids() == [5, 6, 3, 2, 1]
    assert pool.num_free_blocks == 5 and pool.usage == pytest.approx(1 / 6)
    # Cached blocks stay findable while free.
    assert pool.get_cached_block(BlockHash(b"\x00")) is a[0]
    # Reviving the middle of the free queue takes it out in place.
    pool.touch([a[1]])
    assert pool.free_queue.block_ids() == [5, 6, 3, 1]
    assert a[1].ref_cnt == 1
    # Allocation pops from the head and evicts the cached hashes it reuses.
    new = pool.get_new_blocks(3)
    assert [x.block_id for x in new] == [5, 6, 3]
    assert a[2].block_hash is None
    assert pool.get_cached_block(BlockHash(b"\x02")) is None
    assert pool.get_cached_block(BlockHash(b"\x00")) is a[0]  # block 1 not yet evicted
    assert pool.get_cached_block(BlockHash(b"\x01")) is a[1]
    pool.free_blocks(b)
    assert pool.free_queue.block_ids() == [1, 4]


def test_shared_block_freed_only_at_last_reference() -> None:
    pool = BlockPool(num_blocks=3)
    (block,) = pool.get_new_blocks(1)
    pool.cache_block(block, BlockHash(b"h"))
    pool.touch([block])
    assert block.ref_cnt == 2
    pool.free_blocks([block])
    assert pool.num_free_blocks == 1
    pool.free_blocks([block])
    assert pool.num_free_blocks == 2
    with pytest.raises(AssertionError, match="double free"):
        pool.free_blocks([block])


def test_duplicate_hash_keeps_first_block_and_disabled_cache_caches_nothing() -> None:
    pool = BlockPool(num_blocks=4)
    x, y = pool.get_new_blocks(2)
    pool.cache_block(x, BlockHash(b"h"))
    pool.cache_block(y, BlockHash(b"h"))
    assert pool.get_cached_block(BlockHash(b"h")) is x and y.block_hash is None
    off = BlockPool(num_blocks=4, enable_prefix_caching=False)
    (z,) = off.get_new_blocks(1)
    off.cache_block(z, BlockHash(b"h"))
    assert off.get_cached_block(BlockHash(b"h")) is None


def test_reset_prefix_cache() -> None:
    pool = BlockPool(num_blocks=4)
    (x,) = pool.get_new_blocks(1)
    pool.cache_block(x, BlockHash(b"h"))
    assert not pool.reset_prefix_cache()  # still referenced
    pool.free_blocks([x])
    assert pool.reset_prefix_cache()
    assert pool.get_cached_block(BlockHash(b"h")) is None and x.block_hash is None
