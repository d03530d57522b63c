"""Per-request KV block tables on top of the block pool, with automatic prefix caching.

Lifecycle of one request's blocks:

    get_computed_blocks(req)           cached prefix blocks (lookup only, no side effects)
    allocate_slots(req, n, hits)       take the hits + enough new blocks for n more tokens
    cache_blocks(req, num_computed)    after a step: register newly full, computed blocks
    free(req)                          finished, aborted or preempted: return every block

Block hashes are computed incrementally per request (only blocks that became full since
the last call) and kept across preemption, since a request's tokens never change.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Sequence

from engine.core.kv_cache.block_hash import (
    BlockHash,
    encode_extra_keys,
    get_hash_fn,
    hash_block_tokens,
)
from engine.core.kv_cache.block_pool import BlockPool
from engine.core.kv_cache.kv_cache_block import KVCacheBlock
from engine.core.kv_cache.kv_cache_config import KVCacheConfig
from engine.core.request import ReqId, Request
from engine.core.request_tokens import token_slice


def cdiv(a: int, b: int) -> int:
    return -(-a // b)


class KVCacheManager:
    def __init__(self, config: KVCacheConfig) -> None:
        self.config = config
        self.block_size = config.block_size
        self.enable_prefix_caching = config.enable_prefix_caching
        self.hash_fn = get_hash_fn(config.hash_algo)
        self.pool = BlockPool(config.num_blocks, config.enable_prefix_caching)
        self.req_to_blocks: dict[ReqId, list[KVCacheBlock]] = {}
        self.req_to_block_ids: dict[ReqId, list[int]] = {}
        self.req_to_block_hashes: dict[ReqId, list[BlockHash]] = {}
        self._req_extra_keys: dict[ReqId, bytes] = {}
        # How many leading blocks of each request were already offered to the prefix cache.
        self._num_cached_blocks: dict[ReqId, int] = {}
        # Hashes of full blocks that scheduled steps not yet applied are computing, one set
        # per step, oldest first (async scheduling keeps two steps open).
        self._pending_steps: deque[set[BlockHash]] = deque()
        self.prefix_cache_queries = 0  # tokens looked up
        self.prefix_cache_hits = 0  # tokens found

    # -- capacity ---------------------------------------------------------------------------

    @property
    def num_free_blocks(self) -> int:
        return self.pool.num_free_blocks

    @property
    def num_usable_blocks(self) -> int:
        return self.pool.num_usable_blocks

    @property
    def usage(self) -> float:
        return self.pool.usage

    def get_block_ids(self, req_id: ReqId) -> list[int]:
        """The request's block table: the manager's own list, which only grows (by appends)
        while the request holds blocks and is dropped, never edited, by ``free``. Callers
        must not modify it."""
        return self.req_to_block_ids.get(req_id, [])

    # -- prefix cache -------------------------------------------------------------------------

    def uses_prefix_cache(self, request: Request) -> bool:
        # Prompt logprobs need logits at every prompt position, so nothing may be skipped.
        return self.enable_prefix_caching and request.sampling_params.prompt_logprobs is None

    def get_computed_blocks(self, request: Request) -> tuple[list[KVCacheBlock], int]:
        """The longest cached prefix of the request's tokens: (blocks, number of tokens).

        At least the last token is left to compute so the step produces logits to sample,
        so a fully cached sequence of 32 tokens with block_size 16 hits 1 block, not 2.
        """
        if not self.uses_prefix_cache(request):
            return [], 0
        max_hit_blocks = (request.num_tokens - 1) // self.block_size
        hashes = self._block_hashes(request, max_hit_blocks)
        hit_blocks = []
        for block_hash in hashes[:max_hit_blocks]:
            block = self.pool.get_cached_block(block_hash)
            if block is None:
                break
            hit_blocks.append(block)
        return hit_blocks, len(hit_blocks) * self.block_size

    def record_prefix_cache_lookup(self, request: Request, num_hit_tokens: int) -> None:
        """Count one lookup that led to scheduling (retries of a blocked request don't)."""
        if self.uses_prefix_cache(request):
            self.prefix_cache_queries += request.num_tokens
            self.prefix_cache_hits += num_hit_tokens

    def begin_step(self) -> None:
        """A new step is being scheduled (its pending blocks are noted until it ends)."""
        self._pending_steps.append(set())

    def discard_step(self) -> None:
        """The step being scheduled turned out empty: it never runs."""
        self._pending_steps.pop()

    def end_step(self) -> None:
        """The oldest open step was applied: its blocks are cached (or never will be)."""
        self._pending_steps.popleft()

    def abandon_open_steps(self) -> None:
        """No open step will be applied (the runner failed)."""
        self._pending_steps.clear()

    def mark_pending(self, request: Request, num_new_tokens: int) -> None:
        """Note the full blocks this step's chunk of ``request`` will compute.

        Blocks enter the prefix cache only once computed (``cache_blocks`` after the step),
        never on allocation, so a block can never be found before its KV exists. A request
        that needs a block still being computed waits a step instead of recomputing it
        (``is_next_block_pending``): n > 1 siblings and bursts sharing a system prompt
        compute the shared prefix once.
        """
        if not self.enable_prefix_caching:
            return
        start_block = request.num_computed_tokens // self.block_size
        end_block = (request.num_computed_tokens + num_new_tokens) // self.block_size
        if end_block <= start_block:
            return
        hashes = self._block_hashes(request, end_block)
        for block_hash in hashes[start_block:end_block]:
            if self.pool.get_cached_block(block_hash) is None:
                self._pending_steps[-1].add(block_hash)

    def is_next_block_pending(self, request: Request, num_hit_blocks: int) -> bool:
        """Whether the first block after the request's cache hit is being computed now."""
        if not any(self._pending_steps) or not self.uses_prefix_cache(request):
            return False
        if num_hit_blocks >= (request.num_tokens - 1) // self.block_size:
            return False
        block_hash = self._block_hashes(request, num_hit_blocks + 1)[num_hit_blocks]
        return any(block_hash in pending for pending in self._pending_steps)

    def cache_blocks(self, request: Request, num_computed_tokens: int) -> None:
        """Register the request's blocks that are full and computed (prompt or decode)."""
        if not self.enable_prefix_caching:
            return
        req_id = request.req_id
        num_full_blocks = num_computed_tokens // self.block_size
        start = self._num_cached_blocks.get(req_id, 0)
        if num_full_blocks <= start:
            return
        hashes = self._block_hashes(request, num_full_blocks)
        blocks = self.req_to_blocks[req_id]
        for i in range(start, num_full_blocks):
            self.pool.cache_block(blocks[i], hashes[i])
        self._num_cached_blocks[req_id] = num_full_blocks

    def _block_hashes(self, request: Request, num_blocks: int) -> list[BlockHash]:
        """Extend the request's hash chain to at least ``num_blocks`` full blocks."""
        req_id = request.req_id
        hashes = self.req_to_block_hashes.get(req_id)
        if hashes is None:
            hashes = self.req_to_block_hashes[req_id] = []
            self._req_extra_keys[req_id] = encode_extra_keys(request.lora_id, request.cache_salt)
        num_blocks = min(num_blocks, request.num_tokens // self.block_size)
        extra_keys = self._req_extra_keys[req_id]
        bs = self.block_size
        for i in range(len(hashes), num_blocks):
            parent = hashes[-1] if hashes else None
            tokens = token_slice(request, i * bs, (i + 1) * bs)
            hashes.append(hash_block_tokens(self.hash_fn, parent, tokens, extra_keys))
        return hashes

    # -- allocation ---------------------------------------------------------------------------

    def allocate_slots(
        self,
        request: Request,
        num_new_tokens: int,
        new_computed_blocks: Sequence[KVCacheBlock] = (),
    ) -> list[KVCacheBlock] | None:
        """Make room for ``num_new_tokens`` more tokens after the computed ones.

        ``new_computed_blocks`` are prefix-cache hits from ``get_computed_blocks`` (only on a
        request's first allocation after (re)admission). Returns the newly taken blocks, or
        None, changing nothing, when the free queue cannot cover them.

            |<- computed ->|<- hits ->|<- num_new_tokens ->|
            [ existing blocks ][ hit blocks ][ new blocks ....]
        """
        req_id = request.req_id
        blocks = self.req_to_blocks.get(req_id, [])
        if not new_computed_blocks and blocks:
            # Hot path (every decode step): the last block still has room.
            if (request.num_computed_tokens + num_new_tokens) <= len(blocks) * self.block_size:
                return []
        num_computed = request.num_computed_tokens + len(new_computed_blocks) * self.block_size
        num_needed = cdiv(num_computed + num_new_tokens, self.block_size)
        num_new_blocks = max(0, num_needed - len(blocks) - len(new_computed_blocks))
        # Hits that sit in the free queue stop being free once touched.
        num_revived = sum(1 for block in new_computed_blocks if block.ref_cnt == 0)
        if num_new_blocks > self.pool.num_free_blocks - num_revived:
            return None

        self.pool.touch(new_computed_blocks)
        new_blocks = self.pool.get_new_blocks(num_new_blocks)
        if req_id not in self.req_to_blocks:
            self.req_to_blocks[req_id] = blocks
            self.req_to_block_ids[req_id] = []
            self._num_cached_blocks[req_id] = len(new_computed_blocks)
        block_ids = self.req_to_block_ids[req_id]
        for block in (*new_computed_blocks, *new_blocks):
            blocks.append(block)
            block_ids.append(block.block_id)
        return new_blocks

    def free(self, request: Request) -> None:
        """Return every block of the request; the sequence's tail becomes evictable first."""
        req_id = request.req_id
        blocks = self.req_to_blocks.pop(req_id, None)
        self.req_to_block_ids.pop(req_id, None)
        self._num_cached_blocks.pop(req_id, None)
        if blocks:
            self.pool.free_blocks(reversed(blocks))

    def free_block_hashes(self, req_id: ReqId) -> None:
        """Forget a finished request's hash chain (kept across preemption, dropped here)."""
        self.req_to_block_hashes.pop(req_id, None)
        self._req_extra_keys.pop(req_id, None)

    def reset_prefix_cache(self) -> bool:
        return self.pool.reset_prefix_cache()
