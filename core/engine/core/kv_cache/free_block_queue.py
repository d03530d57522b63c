"""The free block queue: a doubly linked list ordered from next-to-evict to last-to-evict.

Allocation pops from the head; freed blocks append at the tail, so the head holds the least
recently used blocks. A prefix-cache hit on a free block removes it from the middle, which
is why this is a linked list (O(1) removal) rather than a deque.

    head <-> b7 <-> b3 <-> b9 <-> tail        popleft() -> b7, remove(b3), append(b1)
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator

from engine.core.kv_cache.kv_cache_block import KVCacheBlock


class FreeBlockQueue:
    def __init__(self, blocks: Iterable[KVCacheBlock]) -> None:
        # Sentinels keep every link non-None inside the list, so no edge cases at the ends.
        self._head = KVCacheBlock(block_id=-1)
        self._tail = KVCacheBlock(block_id=-1)
        self._head.next_free = self._tail
        self._tail.prev_free = self._head
        self.num_free_blocks = 0
        for block in blocks:
            self.append(block)

    def popleft(self) -> KVCacheBlock:
        block = self._head.next_free
        if block is self._tail or block is None:
            raise ValueError("no free blocks left in the KV cache free queue")
        self.remove(block)
        return block

    def remove(self, block: KVCacheBlock) -> None:
        prev_block, next_block = block.prev_free, block.next_free
        assert prev_block is not None and next_block is not None, f"{block} is not free"
        prev_block.next_free = next_block
        next_block.prev_free = prev_block
        block.prev_free = block.next_free = None
        self.num_free_blocks -= 1

    def append(self, block: KVCacheBlock) -> None:
        assert block.prev_free is None and block.next_free is None, f"{block} is already free"
        last = self._tail.prev_free
        assert last is not None
        last.next_free = block
        block.prev_free = last
        block.next_free = self._tail
        self._tail.prev_free = block
        self.num_free_blocks += 1

    def __len__(self) -> int:
        return self.num_free_blocks

    def __iter__(self) -> Iterator[KVCacheBlock]:
        """Blocks from the head (evicted first) to the tail. For tests and debugging."""
        block = self._head.next_free
        while block is not None and block is not self._tail:
            yield block
            block = block.next_free

    def block_ids(self) -> list[int]:
        return [block.block_id for block in self]
