"""The compiled-grammar cache stays within its entry and byte bounds, least recent out."""

from __future__ import annotations

from engine.sampling_params import StructuredOutputsParams as Params
from engine.structured_output import GrammarCache, GrammarKey
from engine_sdk.interfaces.structured_output import CompiledGrammar, GrammarMatcher
from structured_output_fakes import ManagerFactory


class Sized(CompiledGrammar):
    def __init__(self, num_bytes: int) -> None:
        self.num_bytes = num_bytes

    def new_matcher(self) -> GrammarMatcher:
        raise AssertionError("not used")


def key(i: int) -> GrammarKey:
    return GrammarKey("regex", f"r{i:03d}")  # 4 + 5 = 9 bytes of key


def test_entry_bound_evicts_least_recently_used() -> None:
    cache = GrammarCache(max_entries=3, max_bytes=10**6)
    grammars = [Sized(10) for _ in range(5)]
    for i in range(3):
        assert cache.put(key(i), grammars[i])
    assert cache.get(key(0)) is grammars[0]  # refresh 0: 1 is now the oldest
    cache.put(key(3), grammars[3])
    assert key(1) not in cache and key(0) in cache
    cache.put(key(4), grammars[4])
    assert key(2) not in cache
    assert len(cache) == 3 and cache.num_evictions == 2
    assert cache.num_bytes == 3 * (10 + 9)


def test_byte_bound() -> None:
    cache = GrammarCache(max_entries=100, max_bytes=100)
    for i in range(10):
        cache.put(key(i), Sized(31))  # 40 bytes each: two fit
        assert cache.num_bytes <= 100
    assert len(cache) == 2 and key(9) in cache and key(8) in cache
    assert not cache.put(key(50), Sized(1000)), "larger than the whole budget"
    assert key(50) not in cache and len(cache) == 2


def test_replacing_a_key_keeps_the_byte_count_right() -> None:
    cache = GrammarCache(max_entries=10, max_bytes=1000)
    cache.put(key(1), Sized(100))
    cache.put(key(1), Sized(50))
    assert len(cache) == 1 and cache.num_bytes == 59


def test_zero_entries_disables_caching() -> None:
    cache = GrammarCache(max_entries=0, max_bytes=1000)
    assert not cache.put(key(1), Sized(1))
    assert cache.get(key(1)) is None


def test_flood_of_unique_schemas_stays_bounded(make_manager: ManagerFactory) -> None:
    manager = make_manager(max_cache_entries=8, max_cache_bytes=64 << 20)
    for i in range(40):
        schema = {"type": "object", "properties": {f"field_{i}": {"type": "integer"}}}
        manager.compile(Params(json=schema))
        assert len(manager.cache) <= 8
    assert manager.cache.num_evictions == 32
    assert manager.cache.num_bytes <= 64 << 20


def test_byte_budget_with_real_grammars(make_manager: ManagerFactory) -> None:
    manager = make_manager()
    one = manager.compile(Params(regex="x[0-9]{3}"))
    budget = 3 * one.num_bytes + 200
    manager = make_manager(max_cache_bytes=budget)
    for i in range(12):
        manager.compile(Params(regex=f"x[0-9]{{{3 + i % 3}}}y{i}"))
        assert manager.cache.num_bytes <= budget
    assert 1 <= len(manager.cache) <= 3
