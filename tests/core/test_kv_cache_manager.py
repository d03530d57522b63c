"""KV cache manager: exact block tables, prefix hits, caps, isolation, LRU eviction."""

from __future__ import annotations

from core_fakes import make_request
from engine.core.kv_cache import KVCacheConfig, KVCacheManager
from engine.core.request import Request


def _manager(num_blocks: int = 11, block_size: int = 4, **kw: object) -> KVCacheManager:
    return KVCacheManager(KVCacheConfig(num_blocks, block_size, **kw))  # type: ignore[arg-type]


def _admit(kv: KVCacheManager, request: Request) -> list[int]:
    """Look up, allocate the whole rest of the prompt, compute it and cache its blocks."""
    hits, num_hit_tokens = kv.get_computed_blocks(request)
    new = kv.allocate_slots(request, request.num_tokens - num_hit_tokens, hits)
    assert new is not None
    kv.record_prefix_cache_lookup(request, num_hit_tokens)
    request.num_cached_tokens = num_hit_tokens
    request.num_computed_tokens = request.num_tokens
    kv.cache_blocks(request, request.num_computed_tokens)
    return kv.get_block_ids(request.req_id)


def test_prefix_hit_shares_exact_blocks_and_eviction_is_lru() -> None:
    kv = _manager()  # usable blocks 1..10
    a = make_request("a", list(range(100, 110)))  # 10 tokens: 2 full blocks + 2
    assert _admit(kv, a) == [1, 2, 3]
    b = make_request("b", [*range(100, 108), 7, 7])  # same first 8 tokens
    hits, num_hit_tokens = kv.get_computed_blocks(b)
    assert [x.block_id for x in hits] == [1, 2] and num_hit_tokens == 8
    assert _admit(kv, b) == [1, 2, 4]
    assert b.num_cached_tokens == 8
    assert [kv.pool.blocks[i].ref_cnt for i in (1, 2, 3, 4)] == [2, 2, 1, 1]
    assert (kv.prefix_cache_queries, kv.prefix_cache_hits) == (20, 8)

    kv.free(a)  # only block 3 becomes free; 1 and 2 are still b's
    assert kv.pool.free_queue.block_ids() == [5, 6, 7, 8, 9, 10, 3]
    kv.free(b)  # b's blocks join the tail last-first
    assert kv.pool.free_queue.block_ids() == [5, 6, 7, 8, 9, 10, 3, 4, 2, 1]
    assert kv.num_free_blocks == 10 and kv.usage == 0.0

    # Uncached blocks go first, then the cached ones tail-of-sequence first.
    c = make_request("c", list(range(200, 236)))  # 36 tokens: 9 blocks
    assert kv.get_computed_blocks(c) == ([], 0)
    assert [x.block_id for x in kv.allocate_slots(c, 36) or []] == [5, 6, 7, 8, 9, 10, 3, 4, 2]
    kv.free(c)
    d = make_request("d", list(range(100, 110)))
    hits, num_hit_tokens = kv.get_computed_blocks(d)
    assert [x.block_id for x in hits] == [1] and num_hit_tokens == 4  # block 2 was evicted


def test_hits_leave_the_last_token_to_compute() -> None:
    kv = _manager()
    _admit(kv, make_request("a", list(range(12))))  # 3 full blocks cached
    full = make_request("b", list(range(12)))  # the whole prompt is cached...
    hits, num_hit_tokens = kv.get_computed_blocks(full)
    assert len(hits) == 2 and num_hit_tokens == 8  # ...but the last block is recomputed
    longer = make_request("c", list(range(13)))
    assert kv.get_computed_blocks(longer)[1] == 12


def test_decode_filled_blocks_are_cached() -> None:
    kv = _manager()
    a = make_request("a", [1, 2, 3, 4, 5, 6])
    assert _admit(kv, a) == [1, 2]
    a.output_token_ids.append(7)  # sampled by the prefill step
    assert kv.allocate_slots(a, 1) == []  # decode step computes token 7 (position 6)
    a.num_computed_tokens += 1
    kv.cache_blocks(a, a.num_computed_tokens)
    a.output_token_ids.append(8)
    assert kv.pool.blocks[2].block_hash is None  # holds 5, 6, 7 computed; 8 is not yet
    assert kv.allocate_slots(a, 1) == []  # computes token 8: block 2 full and computed
    a.num_computed_tokens += 1
    kv.cache_blocks(a, a.num_computed_tokens)
    assert kv.pool.blocks[2].block_hash is not None
    a.output_token_ids.append(9)
    assert [x.block_id for x in kv.allocate_slots(a, 1) or []] == [3]
    b = make_request("b", [1, 2, 3, 4, 5, 6, 7, 8, 0])
    assert [x.block_id for x in kv.get_computed_blocks(b)[0]] == [1, 2]


def test_cache_salt_and_adapter_isolate() -> None:
    kv = _manager()
    prompt = list(range(9))
    _admit(kv, make_request("a", prompt, cache_salt="alice"))
    assert kv.get_computed_blocks(make_request("b", prompt))[1] == 0
    assert kv.get_computed_blocks(make_request("c", prompt, cache_salt="bob"))[1] == 0
    assert kv.get_computed_blocks(make_request("d", prompt, cache_salt="alice"))[1] == 8
    assert (
        kv.get_computed_blocks(make_request("e", prompt, cache_salt="alice", lora_id="x"))[1] == 0
    )
    _admit(kv, make_request("f", prompt, lora_id="x"))
    assert kv.get_computed_blocks(make_request("g", prompt, lora_id="x"))[1] == 8
    assert kv.get_computed_blocks(make_request("h", prompt, lora_id="y"))[1] == 0


def test_prompt_logprobs_and_disabled_cache_skip_the_lookup() -> None:
    kv = _manager()
    prompt = list(range(9))
    _admit(kv, make_request("a", prompt))
    queries = kv.prefix_cache_queries
    pl = make_request("b", prompt, prompt_logprobs=1)
    assert kv.get_computed_blocks(pl) == ([], 0)
    kv.record_prefix_cache_lookup(pl, 0)
    assert kv.prefix_cache_queries == queries  # not counted as a lookup
    off = _manager(enable_prefix_caching=False)
    _admit(off, make_request("a", prompt))
    assert off.get_computed_blocks(make_request("b", prompt)) == ([], 0)
    assert not off.pool.cached_blocks and off.prefix_cache_queries == 0


def test_allocation_failure_changes_nothing_and_counts_revived_hits() -> None:
    kv = _manager(num_blocks=5)  # usable 1..4
    a = make_request("a", list(range(9)))
    assert _admit(kv, a) == [1, 2, 3]
    kv.free(a)
    assert kv.pool.free_queue.block_ids() == [4, 3, 2, 1]
    # 8 cached tokens (blocks 1, 2, both free) + 9 new tokens: 2 hits + 3 new = 5 blocks > 4.
    b = make_request("b", [*range(8), *range(50, 59)])
    hits, num_hit_tokens = kv.get_computed_blocks(b)
    assert num_hit_tokens == 8
    assert kv.allocate_slots(b, 9, hits) is None
    assert kv.pool.free_queue.block_ids() == [4, 3, 2, 1]
    assert all(x.ref_cnt == 0 for x in kv.pool.blocks[1:]) and kv.get_block_ids("b") == []
    # 2 hits + 2 new fits exactly: the new ones must not evict the hits.
    c = make_request("c", [*range(8), *range(50, 58)])
    hits, _ = kv.get_computed_blocks(c)
    assert [x.block_id for x in kv.allocate_slots(c, 8, hits) or []] == [4, 3]
    assert kv.get_block_ids("c") == [1, 2, 4, 3] and kv.num_free_blocks == 0
