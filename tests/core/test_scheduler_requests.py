"""Request admission and exit: validation, queue bounds, priority, aborts at every stage."""

from __future__ import annotations

import pytest
from core_fakes import (
    check_invariants,
    make_core,
    make_request,
    reference_tokens,
    run_to_completion,
)
from engine.core.request import RequestStatus
from engine.core.scheduler_output import ModelRunnerOutput
from engine.errors import QueueFullError, RequestValidationError


def test_prompt_reaching_max_model_len_is_rejected() -> None:
    core, _ = make_core(max_model_len=16)
    with pytest.raises(ValueError, match="16 tokens but --max-model-len is 16.*at most 15"):
        core.add_request(make_request("a", list(range(16))))
    with pytest.raises(RequestValidationError, match="empty"):
        core.add_request(make_request("b", []))
    core.add_request(make_request("c", list(range(15)), max_tokens=None))
    with pytest.raises(RequestValidationError, match="already in use"):
        core.add_request(make_request("c", [1]))
    result = run_to_completion(core)
    assert result.tokens["c"] == reference_tokens(list(range(15)), 1)
    assert result.finish_reasons["c"] == "length"


def test_queue_bound_on_requests() -> None:
    core, _ = make_core(max_num_queued_reqs=2)
    core.add_request(make_request("a", [1, 2]))
    core.add_request(make_request("b", [1, 2]))
    with pytest.raises(QueueFullError, match=r"--max-num-queued-reqs \(2\)"):
        core.add_request(make_request("c", [1, 2]))
    assert not core.scheduler.requests.get("c")
    core.step()  # both admitted: the queue is empty again
    core.add_request(make_request("c", [1, 2]))
    run_to_completion(core)


def test_queue_bound_on_tokens() -> None:
    core, _ = make_core(max_num_queued_tokens=20)
    core.add_request(make_request("a", list(range(12))))
    with pytest.raises(QueueFullError, match=r"--max-num-queued-tokens \(20\)"):
        core.add_request(make_request("b", list(range(10))))
    core.add_request(make_request("b", list(range(8))))
    with pytest.raises(RequestValidationError, match="--max-num-queued-tokens"):
        core.add_request(make_request("c", list(range(21))))
    core.abort_requests(["a"])  # leaving the queue releases its tokens
    core.add_request(make_request("d", list(range(12))))
    run_to_completion(core)


def _first_scheduled_order(runner) -> list[str]:  # type: ignore[no-untyped-def]
    order: list[str] = []
    for step in runner.steps:
        for req_id, *_ in step.scheduled:
            if req_id not in order:
                order.append(req_id)
    return order


@pytest.mark.parametrize(
    ("policy", "expected"),
    [
        ("priority", ["p1-early", "p1-late", "p3", "p5"]),
        ("fcfs", ["p5", "p1-early", "p3", "p1-late"]),
    ],
)
def test_scheduling_policy_order(policy: str, expected: list[str]) -> None:
    core, runner = make_core(max_num_seqs=1, policy=policy)
    for req_id, priority, t in (
        ("p5", 5, 1.0),
        ("p1-early", 1, 2.0),
        ("p3", 3, 3.0),
        ("p1-late", 1, 4.0),
    ):
        core.add_request(
            make_request(req_id, [1, 2, 3], max_tokens=2, priority=priority, arrival_time=t)
        )
    run_to_completion(core)
    assert _first_scheduled_order(runner) == expected


def _drive_until(core, runner, predicate, max_steps: int = 100) -> None:  # type: ignore[no-untyped-def]
    for _ in range(max_steps):
        if predicate():
            return
        core.step()
    raise AssertionError("state never reached")


@pytest.mark.parametrize("stage", ["waiting", "mid_prefill", "decoding", "preempted"])
def test_abort_at_any_stage_returns_every_block(stage: str) -> None:
    core, runner = make_core(num_blocks=9, block_size=4, max_num_batched_tokens=6, max_model_len=32)
    sched = core.scheduler
    start_free = sched.kv.num_free_blocks
    assert start_free == 8
    core.add_request(make_request("a", list(range(1, 12)), max_tokens=20))
    core.add_request(make_request("b", list(range(40, 47)), max_tokens=20))
    target = {"waiting": "b", "mid_prefill": "a", "decoding": "a", "preempted": "b"}[stage]
    request = sched.requests[target]
    others = [r for r in sched.requests.values() if r is not request]
    if stage == "mid_prefill":
        core.step()
        assert 0 < request.num_computed_tokens < request.num_prompt_tokens
    elif stage == "decoding":
        _drive_until(core, runner, lambda: len(request.output_token_ids) >= 2)
    elif stage == "preempted":
        _drive_until(core, runner, lambda: request.status == RequestStatus.PREEMPTED)
    check_invariants(sched)
    core.abort_requests([target])
    assert request.status == RequestStatus.FINISHED_ABORTED
    assert target not in sched.kv.req_to_blocks
    check_invariants(sched)
    result = run_to_completion(core)
    assert target not in result.finish_reasons  # aborts produce no output
    assert sched.kv.num_free_blocks == start_free
    assert all(b.ref_cnt == 0 for b in sched.kv.pool.blocks[1:])
    assert any(target in s.finished_req_ids for s in runner.steps)
    other = others[0]
    assert other.status == RequestStatus.FINISHED_LENGTH
    assert other.output_token_ids == reference_tokens(other.prompt_token_ids, 20)


def test_abort_between_schedule_and_update() -> None:
    core, runner = make_core()
    sched = core.scheduler
    core.add_request(make_request("a", [1, 2, 3, 4, 5]))
    core.add_request(make_request("b", [6, 7, 8]))
    out = sched.schedule()
    runner_out = runner.execute(out)
    sched.finish_requests(["a", "unknown-id"], RequestStatus.FINISHED_ABORTED)
    outputs = sched.update_from_output(out, runner_out)
    assert [o.req_id for o in outputs] == ["b"]
    assert sched.kv.get_block_ids("a") == [] and [r.req_id for r in sched.running] == ["b"]
    check_invariants(sched)
    assert sched.schedule().finished_req_ids == {"a"}


def test_finish_requests_with_stop_status_and_bad_status() -> None:
    core, _ = make_core()
    request = make_request("a", [1, 2, 3], max_tokens=10)
    core.add_request(request)
    core.step()
    core.finish_requests("a", RequestStatus.FINISHED_STOPPED)
    assert request.status.finish_reason == "stop" and not core.has_unfinished_requests()
    assert core.scheduler.kv.num_free_blocks == core.scheduler.kv.num_usable_blocks
    with pytest.raises(ValueError, match="FINISHED_"):
        core.finish_requests("a", RequestStatus.RUNNING)


def test_update_requires_a_token_for_sampled_requests() -> None:
    core, _ = make_core()
    core.add_request(make_request("a", [1, 2, 3]))
    out = core.scheduler.schedule()
    with pytest.raises(RuntimeError, match="no sampled token for request 'a'"):
        core.scheduler.update_from_output(out, ModelRunnerOutput())
