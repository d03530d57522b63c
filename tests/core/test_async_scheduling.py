"""Async scheduling in the engine core: the step after N is scheduled and launched before
N's tokens reach the host. What must still hold exactly: stop conditions (nothing of a
later step is delivered after a request finished), max_tokens (no token computed past it),
aborts and preemption while a step is in flight."""

from __future__ import annotations

from collections.abc import Iterator

import core_fakes
import pytest
from core_fakes import make_core, make_request, reference_tokens, run_to_completion
from engine.core.request import RequestStatus

PROMPT = [5, 6, 7, 8, 9]


@pytest.fixture(autouse=True)
def async_scheduling() -> Iterator[bool]:
    """Overrides conftest's sync/async parametrization: these tests are about async."""
    core_fakes.ASYNC_SCHEDULING[0] = True
    yield True
    core_fakes.ASYNC_SCHEDULING[0] = False


def test_placeholders_feed_the_next_step_from_the_device() -> None:
    core, runner = make_core()
    core.add_request(make_request("a", PROMPT, max_tokens=6))
    result = run_to_completion(core)
    assert result.tokens["a"] == reference_tokens(PROMPT, 6)
    # Every decode input after the first token came from the previous step's samples.
    assert runner.num_placeholder_inputs == 5


def test_a_stop_token_ends_the_request_before_the_step_in_flight_counts() -> None:
    ref = reference_tokens(PROMPT, 8)
    stop = ref[2]
    assert stop not in ref[:2]
    core, runner = make_core()
    core.add_request(make_request("a", PROMPT, max_tokens=8, stop_token_ids=[stop]))
    result = run_to_completion(core)
    assert result.tokens["a"] == ref[:3]
    assert result.finish_reasons["a"] == "stop" and result.stop_reasons["a"] == stop
    # The device computed one more token for it (scheduled before the stop was known)...
    assert sum(1 for s in runner.steps for r in s.scheduled if r[0] == "a" and r[3]) == 4
    # ...which was never delivered: exactly one output per delivered token.
    assert sum(len(o.new_token_ids) for o in result.outputs if o.req_id == "a") == 3


def test_no_token_is_computed_past_max_tokens() -> None:
    core, runner = make_core()
    core.add_request(make_request("a", PROMPT, max_tokens=4))
    result = run_to_completion(core)
    assert result.tokens["a"] == reference_tokens(PROMPT, 4)
    assert result.finish_reasons["a"] == "length"
    num_sampled = sum(1 for s in runner.steps for r in s.scheduled if r[0] == "a" and r[3])
    assert num_sampled == 4


def test_abort_while_a_step_is_in_flight() -> None:
    core, _ = make_core()
    core.add_request(make_request("a", PROMPT, max_tokens=10))
    core.add_request(make_request("b", [1, 2, 3], max_tokens=10))
    delivered: dict[str, list[int]] = {"a": [], "b": []}
    for _ in range(3):
        for out in core.step():
            delivered[out.req_id].extend(out.new_token_ids)
    core.abort_requests("a")
    num_a = len(delivered["a"])
    result = run_to_completion(core)
    assert "a" not in result.tokens  # nothing of a after its abort
    assert delivered["a"] == reference_tokens(PROMPT, num_a)
    assert delivered["b"] + result.tokens["b"] == reference_tokens([1, 2, 3], 10)
    assert not core.scheduler.requests and core.scheduler.kv.pool.num_free_blocks > 0


def test_a_request_preempted_while_its_step_runs_keeps_that_token() -> None:
    # 5 usable blocks of 4: two sequences of 5-token prompts outgrow them while decoding.
    core, _ = make_core(num_blocks=6, block_size=4, max_model_len=20, enable_prefix_caching=False)
    prompts = {"a": PROMPT, "b": [11, 12, 13, 14, 15]}
    requests = {k: make_request(k, p, max_tokens=9) for k, p in prompts.items()}
    for request in requests.values():
        core.add_request(request)
    applied_to_queued = []
    original = core.scheduler._apply_to_preempted

    def spy(*args: object, **kwargs: object) -> object:
        applied_to_queued.append(args[0].req_id)  # type: ignore[attr-defined]
        return original(*args, **kwargs)  # type: ignore[arg-type]

    core.scheduler._apply_to_preempted = spy  # type: ignore[method-assign]
    result = run_to_completion(core)
    assert applied_to_queued, "no request was preempted with a step in flight"
    assert requests["b"].num_preemptions > 0
    for req_id, prompt in prompts.items():
        assert result.tokens[req_id] == reference_tokens(prompt, 9)
        assert requests[req_id].status is RequestStatus.FINISHED_LENGTH


def test_requests_needing_their_history_are_sampled_after_the_step_in_flight() -> None:
    """Penalties and min_tokens read the output so far: such a request's forward pass runs
    ahead, its sampling waits until the previous token is applied (checked by the fake
    runner at sampling time), and the tokens stay those of the reference."""
    core_fakes.DEFERRED_WITH_HISTORY[0] = 0
    core, runner = make_core()
    prompts = {"pen": PROMPT, "min": [1, 2, 3], "plain": [4, 5, 6, 7]}
    core.add_request(make_request("pen", prompts["pen"], max_tokens=6, repetition_penalty=1.2))
    core.add_request(make_request("min", prompts["min"], max_tokens=6, min_tokens=4))
    core.add_request(make_request("plain", prompts["plain"], max_tokens=6))
    result = run_to_completion(core)
    for req_id, prompt in prompts.items():
        assert result.tokens[req_id] == reference_tokens(prompt, 6)
    # pen: 5 decode samplings deferred; min: the 3 while it is short of min_tokens.
    assert core_fakes.DEFERRED_WITH_HISTORY[0] == 5 + 3
    assert runner.num_placeholder_inputs == 3 * 5  # no request waited for the host


def test_a_failed_step_leaves_no_pending_prefix_blocks_behind() -> None:
    """A runner failure abandons the open steps: a later request sharing the prefix their
    blocks were computing is not held back waiting for blocks that never arrive."""
    core, runner = make_core(block_size=4)
    core.add_request(make_request("a", [*PROMPT, 1, 2, 3], max_tokens=4))
    original = runner.execute

    def fail(*_: object) -> object:
        raise RuntimeError("device lost")

    runner.execute = fail  # type: ignore[method-assign]
    with pytest.raises(RuntimeError):
        core.step()
    core.abort_requests("a")
    runner.execute = original  # type: ignore[method-assign]
    core.add_request(make_request("b", [*PROMPT, 1, 2, 3], max_tokens=2))
    result = run_to_completion(core, max_steps=20)
    assert result.tokens["b"] == reference_tokens([*PROMPT, 1, 2, 3], 2)
