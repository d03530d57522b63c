"""Automatic prefix caching through the scheduler: a shared system prompt computed once."""

from __future__ import annotations

import pytest
from core_fakes import make_core, make_request, reference_tokens, run_to_completion

SYSTEM = list(range(100, 113))  # 13 tokens: 3 full blocks of 4 + 1


@pytest.mark.parametrize("hash_algo", ["sha256", "xxhash"])
def test_shared_system_prompt_is_computed_once(hash_algo: str) -> None:
    core, runner = make_core(block_size=4, hash_algo=hash_algo)
    a_prompt, b_prompt = [*SYSTEM, 1, 2, 3, 4, 5], [*SYSTEM, 7, 8, 9]
    core.add_request(make_request("a", a_prompt, max_tokens=2))
    first = run_to_completion(core)
    b = make_request("b", b_prompt, max_tokens=2)
    core.add_request(b)
    second = run_to_completion(core)
    assert b.num_cached_tokens == 12  # the 3 full system-prompt blocks
    b_steps = [entry for s in runner.steps for entry in s.scheduled if entry[0] == "b"]
    assert b_steps[0] == ("b", 12, len(b_prompt) - 12, True)  # only the rest is computed
    assert first.tokens["a"] == reference_tokens(a_prompt, 2)
    assert second.tokens["b"] == reference_tokens(b_prompt, 2)
    assert second.outputs[0].num_cached_tokens == 12
    stats = core.stats()
    assert (stats.prefix_cache_queries, stats.prefix_cache_hits) == (18 + 16, 12)
    assert stats.prefix_cache_hit_rate == pytest.approx(12 / 34)


def test_cache_salt_isolates_in_the_scheduler() -> None:
    core, runner = make_core(block_size=4)
    prompt = [*SYSTEM, 1]
    core.add_request(make_request("a", prompt, max_tokens=1, cache_salt="tenant-1"))
    run_to_completion(core)
    other = make_request("b", prompt, max_tokens=1, cache_salt="tenant-2")
    same = make_request("c", prompt, max_tokens=1, cache_salt="tenant-1")
    core.add_request(other)
    run_to_completion(core)
    core.add_request(same)
    result = run_to_completion(core)
    assert (other.num_cached_tokens, same.num_cached_tokens) == (0, 12)
    assert result.tokens["c"] == reference_tokens(prompt, 1)


def test_disabled_prefix_caching_computes_everything() -> None:
    core, runner = make_core(block_size=4, enable_prefix_caching=False)
    for req_id in ("a", "b"):
        core.add_request(make_request(req_id, [*SYSTEM, 1], max_tokens=1))
        run_to_completion(core)
    assert [s.scheduled[0][1:3] for s in runner.steps] == [(0, 14), (0, 14)]
    assert core.stats().prefix_cache_queries == 0


def test_prompt_logprobs_request_recomputes_the_cached_prefix() -> None:
    core, runner = make_core(block_size=4)
    core.add_request(make_request("a", [*SYSTEM, 1], max_tokens=1))
    run_to_completion(core)
    core.add_request(make_request("b", [*SYSTEM, 1], max_tokens=1, prompt_logprobs=0))
    result = run_to_completion(core)
    assert runner.steps[-1].scheduled == [("b", 0, 14, True)]
    lps = [lp.token_id for o in result.outputs for lp in (o.new_prompt_logprobs or [])]
    assert lps == [*SYSTEM, 1][1:]


def test_many_requests_sharing_prefixes_match_the_reference() -> None:
    core, _ = make_core(num_blocks=40, block_size=4, max_num_seqs=6, max_num_batched_tokens=24)
    prompts = {f"r{i}": [*SYSTEM[: 4 + (i % 9)], i, i + 1] for i in range(20)}
    for req_id, prompt in prompts.items():
        core.add_request(make_request(req_id, prompt, max_tokens=6))
    result = run_to_completion(core)
    for req_id, prompt in prompts.items():
        assert result.tokens[req_id] == reference_tokens(prompt, 6)
    assert core.stats().prefix_cache_hits > 0


@pytest.mark.parametrize("policy", ["fcfs", "priority"])
def test_siblings_added_together_wait_for_the_shared_prefix(
    policy: str, async_scheduling: bool
) -> None:
    """n > 1 fan-out / a burst sharing a system prompt: the prefix is computed once; the
    others wait for it instead of recomputing it in the same step. With async scheduling
    a computed block enters the cache when its step is applied, one step later: the
    siblings wait one more step (and the first two requests' last step is skipped, their
    tokens in flight already reach max_tokens)."""
    core, runner = make_core(block_size=4, max_num_batched_tokens=64, policy=policy)
    prompts = {f"s{i}": [*SYSTEM, 50 + i] for i in range(4)}
    requests = [make_request(k, p, max_tokens=2) for k, p in prompts.items()]
    for request in requests:
        core.add_request(request)
    core.add_request(make_request("other", [1, 2, 3], max_tokens=2))
    result = run_to_completion(core)
    assert runner.steps[0].scheduled == [("s0", 0, 14, True), ("other", 0, 3, True)]
    first_decodes = [("s0", 14, 1, True), ("other", 3, 1, True)]
    siblings = [("s1", 12, 2, True), ("s2", 12, 2, True), ("s3", 12, 2, True)]
    if async_scheduling:
        assert runner.steps[1].scheduled == first_decodes
        assert runner.steps[2].scheduled == siblings
    else:
        assert runner.steps[1].scheduled == first_decodes + siblings
    assert [r.num_cached_tokens for r in requests] == [0, 12, 12, 12]
    for req_id, prompt in prompts.items():
        assert result.tokens[req_id] == reference_tokens(prompt, 2)


def test_chunked_shared_prefix_is_followed_block_by_block(async_scheduling: bool) -> None:
    core, runner = make_core(block_size=4, max_num_batched_tokens=6)
    a_prompt, b_prompt = [*SYSTEM, 1], [*SYSTEM, 2]
    core.add_request(make_request("a", a_prompt, max_tokens=1))
    core.add_request(make_request("b", b_prompt, max_tokens=1))
    result = run_to_completion(core)
    # b waits while a computes the blocks b needs, then hits all 3 shared blocks.
    last = [[("a", 12, 2, True)], [("b", 12, 2, True)]]  # async: a's blocks cached a step later
    assert [s.scheduled for s in runner.steps] == [
        [("a", 0, 6, False)],
        [("a", 6, 6, False)],
        *(last if async_scheduling else [last[0] + last[1]]),
    ]
    assert result.tokens == {
        "a": reference_tokens(a_prompt, 1),
        "b": reference_tokens(b_prompt, 1),
    }
