"""Randomized add / step / abort / stop sequences: block ownership stays consistent, every
block comes back, and every generated token matches the reference model."""

from __future__ import annotations

import random

import pytest
from core_fakes import check_invariants, make_core, make_request, reference_tokens
from engine.core.request import RequestStatus
from engine.errors import QueueFullError
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

PREFIXES = [[], [5, 6, 7, 8, 9, 10, 11], [5, 6, 7, 8, 1, 2], [40] * 9]
MAX_MODEL_LEN = 24

config_strategy = st.fixed_dictionaries(
    {
        "block_size": st.sampled_from([1, 2, 4]),
        "extra_blocks": st.integers(0, 3),
        "max_num_seqs": st.integers(1, 6),
        "max_num_batched_tokens": st.integers(1, 30),
        "policy": st.sampled_from(["fcfs", "priority"]),
        "enable_prefix_caching": st.booleans(),
        "hash_algo": st.sampled_from(["sha256", "xxhash"]),
        "long_prefill_token_threshold": st.sampled_from([0, 0, 3]),
        "max_num_queued_reqs": st.sampled_from([None, None, 4]),
    }
)

add_strategy = st.tuples(
    st.just("add"),
    st.integers(0, len(PREFIXES) - 1),
    st.lists(st.integers(0, 60), min_size=0, max_size=12),
    st.integers(1, 20),  # max_tokens
    st.integers(0, 3),  # priority
    st.sampled_from([None, "s1"]),  # cache salt
)
op_strategy = st.one_of(
    add_strategy,
    add_strategy,
    st.tuples(st.just("step")),
    st.tuples(st.just("step")),
    st.tuples(st.just("step")),
    st.tuples(st.just("abort"), st.integers(0, 30)),
    st.tuples(st.just("stop"), st.integers(0, 30)),
)


@settings(max_examples=120, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(config=config_strategy, ops=st.lists(op_strategy, min_size=5, max_size=60))
def test_random_operations_keep_the_pool_consistent(config: dict, ops: list) -> None:  # type: ignore[type-arg]
    block_size = config.pop("block_size")
    num_blocks = -(-MAX_MODEL_LEN // block_size) + 1 + config.pop("extra_blocks")
    if config["long_prefill_token_threshold"] == 0:
        config.pop("long_prefill_token_threshold")
    core, _ = make_core(
        num_blocks=num_blocks, block_size=block_size, max_model_len=MAX_MODEL_LEN, **config
    )
    sched = core.scheduler
    start_free = sched.kv.num_free_blocks
    requests = []
    for op in ops:
        if op[0] == "add":
            _, prefix, suffix, max_tokens, priority, salt = op
            prompt = (PREFIXES[prefix] + suffix)[: MAX_MODEL_LEN - 1] or [1]
            request = make_request(
                f"r{len(requests)}", prompt, max_tokens, priority=priority, cache_salt=salt
            )
            try:
                core.add_request(request)
            except QueueFullError:
                continue
            requests.append(request)
        elif op[0] == "step":
            core.step()
        elif requests:
            target = requests[op[1] % len(requests)]
            status = (
                RequestStatus.FINISHED_ABORTED
                if op[0] == "abort"
                else RequestStatus.FINISHED_STOPPED
            )
            core.finish_requests([target.req_id], status)
        check_invariants(sched)

    for _ in range(2000):
        if not core.has_unfinished_requests():
            break
        core.step()
        check_invariants(sched)
    assert not core.has_unfinished_requests(), "livelock: requests never finish"
    assert sched.kv.num_free_blocks == start_free
    assert all(block.ref_cnt == 0 for block in sched.kv.pool.blocks[1:])
    assert not sched.kv.req_to_blocks and not sched.kv.req_to_block_hashes
    for request in requests:
        assert request.is_finished
        expected = reference_tokens(request.prompt_token_ids, len(request.output_token_ids))
        assert request.output_token_ids == expected, request.req_id
        if request.status == RequestStatus.FINISHED_LENGTH:
            assert len(request.output_token_ids) == request.sampling_params.max_tokens or (
                request.num_tokens == MAX_MODEL_LEN
            )


@pytest.mark.parametrize("seed", range(12))
def test_heavy_preemption_with_random_aborts(seed: int) -> None:
    """A pool that holds barely one full sequence, many concurrent requests."""
    rng = random.Random(seed)
    policy = "priority" if seed % 2 else "fcfs"
    core, _ = make_core(
        num_blocks=8, block_size=4, max_model_len=MAX_MODEL_LEN, max_num_seqs=6, policy=policy
    )
    sched = core.scheduler
    requests = []
    for i in range(14):
        prefix = PREFIXES[rng.randrange(len(PREFIXES))]
        prompt = (prefix + [rng.randrange(60) for _ in range(rng.randrange(1, 8))])[:20]
        request = make_request(f"r{i}", prompt, rng.randrange(4, 16), priority=rng.randrange(3))
        core.add_request(request)
        requests.append(request)
    for _ in range(3000):
        if not core.has_unfinished_requests():
            break
        core.step()
        if rng.random() < 0.05:
            core.abort_requests([rng.choice(requests).req_id])
        check_invariants(sched)
    assert not core.has_unfinished_requests()
    assert sched.num_preemptions > 0
    assert sched.kv.num_free_blocks == 7
    for request in requests:
        expected = reference_tokens(request.prompt_token_ids, len(request.output_token_ids))
        assert request.output_token_ids == expected
