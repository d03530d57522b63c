"""EngineCore: the step loop around the scheduler and any runner."""

from __future__ import annotations

from core_fakes import make_core, make_request, reference_tokens, run_to_completion
from engine.core.engine_core import EngineCore, ModelRunnerProtocol
from engine.core.scheduler_output import ModelRunnerOutput, SchedulerOutput


class _CountingRunner:
    def __init__(self, inner: ModelRunnerProtocol) -> None:
        self.inner = inner
        self.num_calls = 0

    def execute(self, scheduler_output: SchedulerOutput) -> ModelRunnerOutput:
        self.num_calls += 1
        return self.inner.execute(scheduler_output)


def test_empty_schedule_does_not_call_the_runner() -> None:
    core, fake = make_core()
    counting = _CountingRunner(fake)
    core = EngineCore(core.scheduler, counting)
    assert core.step() == [] and counting.num_calls == 0
    assert not core.has_unfinished_requests()
    core.add_request(make_request("a", [1, 2, 3], max_tokens=2))
    assert core.has_unfinished_requests()
    outputs = core.step()
    assert counting.num_calls == 1 and [o.new_token_ids for o in outputs] == [
        reference_tokens([1, 2, 3], 1)
    ]
    core.abort_requests("a")
    assert core.step() == [] and counting.num_calls == 1
    # The abort reaches the runner with the next non-empty step.
    core.add_request(make_request("b", [4, 5], max_tokens=1))
    core.step()
    assert fake.steps[-1].finished_req_ids == {"a"}


def test_many_requests_with_decode_filled_blocks_match_the_reference() -> None:
    core, runner = make_core(
        num_blocks=200, block_size=4, max_num_seqs=16, max_num_batched_tokens=32, max_model_len=64
    )
    prompts = {f"r{i}": [(i * 7 + k) % 97 for k in range(3 + i % 11)] for i in range(40)}
    for req_id, prompt in prompts.items():
        core.add_request(make_request(req_id, prompt, max_tokens=12))
    result = run_to_completion(core)
    assert result.tokens == {k: reference_tokens(p, 12) for k, p in prompts.items()}
    assert all(len(s.scheduled) <= 16 for s in runner.steps)
    assert all(sum(n for _, _, n, _ in s.scheduled) <= 32 for s in runner.steps)
    stats = core.stats()
    assert (stats.num_running, stats.num_waiting, stats.kv_cache_usage) == (0, 0, 0.0)
    assert stats.num_free_blocks == stats.num_total_blocks == 199
