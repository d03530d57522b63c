"""Preemption by recompute under a tiny KV pool: victims, accounting, identical outputs."""

from __future__ import annotations

import logging

import pytest
from core_fakes import make_core, make_request, reference_tokens, run_to_completion
from engine.core.request import RequestStatus


@pytest.mark.parametrize("enable_prefix_caching", [True, False])
def test_preempted_requests_finish_with_the_same_tokens(
    enable_prefix_caching: bool, caplog: pytest.LogCaptureFixture
) -> None:
    # 8 usable blocks of 4 = 32 tokens; three requests grow to 20 tokens (5 blocks) each.
    core, runner = make_core(
        num_blocks=9,
        block_size=4,
        max_model_len=32,
        enable_prefix_caching=enable_prefix_caching,
    )
    prompts = {f"r{i}": [i + 1] * 3 + list(range(10 * i, 10 * i + 5)) for i in range(3)}
    requests = {k: make_request(k, p, max_tokens=12) for k, p in prompts.items()}
    for request in requests.values():
        core.add_request(request)
    with caplog.at_level(logging.WARNING, logger="engine.core.scheduler"):
        result = run_to_completion(core)
    for req_id, prompt in prompts.items():
        assert result.tokens[req_id] == reference_tokens(prompt, 12)
        assert result.finish_reasons[req_id] == "length"
    stats = core.stats()
    assert stats.num_preemptions > 0
    assert stats.num_preemptions == sum(r.num_preemptions for r in requests.values())
    assert requests["r0"].num_preemptions == 0  # the earliest request is never the victim
    preempted = set().union(*(s.preempted_req_ids for s in runner.steps))
    assert preempted and "r0" not in preempted
    assert stats.num_free_blocks == stats.num_total_blocks == 8
    # Logged as a (rate-limited) warning, never an error.
    records = [r for r in caplog.records if "preempted" in r.getMessage()]
    assert len(records) == 1 and records[0].levelno == logging.WARNING


def test_recompute_runs_prompt_plus_outputs_and_reuses_cached_prefix() -> None:
    core, runner = make_core(num_blocks=9, block_size=4, max_model_len=32)
    a = make_request("a", list(range(1, 9)), max_tokens=16)  # grows to 24 tokens: 6 blocks
    b = make_request("b", list(range(50, 58)), max_tokens=16)
    core.add_request(a)
    core.add_request(b)
    result = run_to_completion(core)
    assert b.num_preemptions >= 1
    # Find b's re-admission: a step scheduling b from a nonzero position after its
    # preemption, covering prompt + outputs so far minus a cached prefix.
    preempt_step = next(i for i, s in enumerate(runner.steps) if "b" in s.preempted_req_ids)
    resume = next(
        entry for s in runner.steps[preempt_step:] for entry in s.scheduled if entry[0] == "b"
    )
    _, start, num_tokens, sample = resume
    assert sample and start % 4 == 0 and start > 0  # a cached-block prefix was reused
    assert start + num_tokens > 8  # the recompute covers output tokens too
    assert result.tokens["b"] == reference_tokens(list(range(50, 58)), 16)
    assert b.num_cached_tokens == 0  # first-schedule hits only


def test_priority_victim_already_scheduled_is_unscheduled() -> None:
    # 4 usable blocks of 4 tokens; b (low priority, admitted first) is decoding when
    # a (high priority) needs a block: b must give its blocks back within the same step.
    core, runner = make_core(num_blocks=5, block_size=4, max_model_len=16, policy="priority")
    b = make_request("b", [9, 8, 7, 6, 5], max_tokens=8, priority=9)
    core.add_request(b)
    core.step()
    a = make_request("a", [1, 2, 3, 4, 5, 6, 7], max_tokens=5, priority=0)
    core.add_request(a)
    steps = []
    while core.has_unfinished_requests():
        core.step()
        steps.append(runner.steps[-1])
        if b.status == RequestStatus.PREEMPTED and len(steps) < 10:
            break
    victim_step = runner.steps[-1]
    assert victim_step.preempted_req_ids == {"b"}
    assert [r for r, *_ in victim_step.scheduled] == ["a"]  # b unscheduled, a got the block
    assert core.scheduler.stats().num_preemptions == 1
    run_to_completion(core)
    assert a.output_token_ids == reference_tokens(a.prompt_token_ids, 5)
    assert b.output_token_ids == reference_tokens(b.prompt_token_ids, 8)


def test_prompt_logprobs_are_not_resent_after_a_mid_prefill_preemption() -> None:
    core, runner = make_core(num_blocks=9, block_size=4, max_model_len=32, max_num_batched_tokens=5)
    x = make_request("x", [1, 2, 3, 4], max_tokens=26)
    prompt = list(range(60, 80))
    y = make_request("y", prompt, max_tokens=2, prompt_logprobs=0)
    core.add_request(x)
    core.add_request(y)
    result = run_to_completion(core)
    assert y.num_preemptions >= 1
    preempt_step = next(i for i, s in enumerate(runner.steps) if "y" in s.preempted_req_ids)
    computed_before = sum(s.num_tokens("y") for s in runner.steps[:preempt_step])
    assert 0 < computed_before  # it had delivered some prompt logprobs already
    lps = [lp for o in result.outputs if o.req_id == "y" for lp in (o.new_prompt_logprobs or [])]
    assert [lp.token_id for lp in lps] == prompt[1:]
    assert result.tokens["y"] == reference_tokens(prompt, 2)
    assert result.tokens["x"] == reference_tokens([1, 2, 3, 4], 26)
