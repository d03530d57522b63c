"""Test helpers for the engine core: a fake runner with a simulated paged KV cache, a
reference generator, builders and a pool invariant checker.

The fake runner writes every computed token id into a fake KV store at the slot its block
table gives, then "attends" by reading positions 0..end-1 back through the block table.
The sampled token is a deterministic function of what it read, so a wrong block table, a
bad prefix-cache hit or a block reused while still owned changes the generated tokens.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field

from engine.core.engine_core import EngineCore
from engine.core.kv_cache import KVCacheConfig
from engine.core.outputs import EngineCoreOutput
from engine.core.request import ReqId, Request
from engine.core.scheduler import Scheduler
from engine.core.scheduler_config import SchedulerConfig
from engine.core.scheduler_output import (
    PLACEHOLDER_TOKEN_ID,
    Logprobs,
    ModelRunnerOutput,
    SchedulerOutput,
)
from engine.sampling_params import SamplingParams

# make_core's default for async scheduling; tests/core/conftest.py runs every test both ways.
ASYNC_SCHEDULING = [False]
# Deferred samplings of requests that needed their history (checked by the async tests).
DEFERRED_WITH_HISTORY = [0]


def next_token(seq: list[int]) -> int:
    """The fake model: a position-weighted checksum of the sequence, in [10, 60)."""
    return sum((i + 1) * t for i, t in enumerate(seq)) % 50 + 10


def reference_tokens(prompt: list[int], num_tokens: int) -> list[int]:
    """What a correct engine generates for ``prompt`` (no stop conditions applied)."""
    seq = list(prompt)
    out = []
    for _ in range(num_tokens):
        token = next_token(seq)
        out.append(token)
        seq.append(token)
    return out


@dataclass
class StepRecord:
    """(req_id, start_position, num_tokens, sample) per scheduled request of one step."""

    scheduled: list[tuple[str, int, int, bool]]
    finished_req_ids: set[str]
    preempted_req_ids: set[str]

    def num_tokens(self, req_id: str) -> int:
        return sum(n for r, _, n, _ in self.scheduled if r == req_id)


@dataclass
class FakeKVRunner:
    num_blocks: int
    block_size: int
    steps: list[StepRecord] = field(default_factory=list)

    def __post_init__(self) -> None:
        self.kv: list[list[int | None]] = [[None] * self.block_size for _ in range(self.num_blocks)]
        # "Device" state for async scheduling: the last step's sampled ids, which stand in
        # for the placeholder inputs of the next step.
        self.prev_sampled: dict[str, int] = {}
        self.num_placeholder_inputs = 0

    def execute_async(
        self, scheduler_output: SchedulerOutput, defer_sampling: bool = False
    ) -> _Pending:
        """Runs the step at launch, as a device runs launched work in order; the host gets
        the result later. Deferred sampling is checked: by then every token before the
        sampled position of a request that needs its history must be on the host."""
        output = self.execute(scheduler_output)
        return _Pending(output, scheduler_output, defer_sampling)

    def execute(self, scheduler_output: SchedulerOutput) -> ModelRunnerOutput:
        assert not scheduler_output.is_empty, "the engine must not run an empty schedule"
        bs = self.block_size
        self.steps.append(
            StepRecord(
                [
                    (s.req_id, s.start_position, s.num_tokens, s.sample)
                    for s in scheduler_output.scheduled
                ],
                set(scheduler_output.finished_req_ids),
                set(scheduler_output.preempted_req_ids),
            )
        )
        assert scheduler_output.num_scheduled_tokens == sum(
            s.num_tokens for s in scheduler_output.scheduled
        )
        for s in scheduler_output.scheduled:  # write the new tokens' "KV"
            for k, token in enumerate(s.token_ids):
                if token == PLACEHOLDER_TOKEN_ID:
                    assert k == len(s.token_ids) - 1, "only the last input is a placeholder"
                    token = self.prev_sampled[s.req_id]
                    self.num_placeholder_inputs += 1
                pos = s.start_position + k
                block_id = s.block_ids[pos // bs]
                assert block_id != 0, "the null block must never hold a request's tokens"
                self.kv[block_id][pos % bs] = token
        out = ModelRunnerOutput()
        for s in scheduler_output.scheduled:  # "attend" over everything up to the chunk end
            end = s.start_position + s.num_tokens
            seq = [self.kv[s.block_ids[p // bs]][p % bs] for p in range(end)]
            known = min(end, s.request.num_tokens)  # the host may lag by a token in flight
            assert seq[:known] == s.request.all_token_ids[:known], f"{s.req_id}: KV is wrong"
            params = s.request.sampling_params
            if s.sample:
                token = next_token(seq)
                out.sampled_token_ids[s.req_id] = token
                if params.logprobs is not None:
                    out.logprobs[s.req_id] = Logprobs(token, -float(token), 1)
            if params.prompt_logprobs is not None:
                prompt = s.request.prompt_token_ids
                entries = [
                    Logprobs(prompt[p + 1], -float(p + 1), 1)
                    for p in range(s.start_position, end)
                    if p + 1 < len(prompt)
                ]
                if entries:
                    out.prompt_logprobs[s.req_id] = entries
        self.prev_sampled = dict(out.sampled_token_ids)
        return out


@dataclass
class _Pending:
    output: ModelRunnerOutput
    scheduler_output: SchedulerOutput
    deferred: bool
    sampled: bool = False
    num_deferred_with_history: int = 0

    def launch_sampling(self) -> None:
        if self.sampled:
            return
        self.sampled = True
        for s in self.scheduler_output.scheduled:
            request = s.request
            if self.deferred and s.sample and request.needs_host_history:
                if request.is_finished:
                    continue  # applied as finished meanwhile: its token is dropped
                known = request.num_tokens
                assert known == s.start_position + s.num_tokens, (
                    f"{s.req_id}: sampled with {known} tokens on the host, needs "
                    f"{s.start_position + s.num_tokens}"
                )
                DEFERRED_WITH_HISTORY[0] += 1

    def result(self) -> ModelRunnerOutput:
        assert self.sampled or not self.deferred, "a deferred step was never sampled"
        self.launch_sampling()
        return self.output


def make_core(
    *,
    num_blocks: int = 64,
    block_size: int = 4,
    max_num_seqs: int = 8,
    max_num_batched_tokens: int = 64,
    max_model_len: int = 64,
    enable_prefix_caching: bool = True,
    hash_algo: str = "sha256",
    async_scheduling: bool | None = None,
    **scheduler_kwargs: object,
) -> tuple[EngineCore, FakeKVRunner]:
    scheduler = Scheduler(
        SchedulerConfig(
            max_num_seqs=max_num_seqs,
            max_num_batched_tokens=max_num_batched_tokens,
            max_model_len=max_model_len,
            **scheduler_kwargs,  # type: ignore[arg-type]
        ),
        KVCacheConfig(num_blocks, block_size, enable_prefix_caching, hash_algo),
    )
    runner = FakeKVRunner(num_blocks, block_size)
    if async_scheduling is None:
        async_scheduling = ASYNC_SCHEDULING[0]
    return EngineCore(scheduler, runner, runner if async_scheduling else None), runner


def make_request(
    req_id: str,
    prompt: list[int],
    max_tokens: int | None = 4,
    *,
    priority: int = 0,
    cache_salt: str | None = None,
    lora_id: str | None = None,
    arrival_time: float | None = None,
    **params: object,
) -> Request:
    request = Request(
        req_id=ReqId(req_id),
        prompt_token_ids=list(prompt),
        sampling_params=SamplingParams(max_tokens=max_tokens, **params),  # type: ignore[arg-type]
        priority=priority,
        cache_salt=cache_salt,
        lora_id=lora_id,
    )
    if arrival_time is not None:
        request.arrival_time = arrival_time
    return request


@dataclass
class RunResult:
    tokens: dict[str, list[int]] = field(default_factory=dict)
    finish_reasons: dict[str, str] = field(default_factory=dict)
    stop_reasons: dict[str, int | str | None] = field(default_factory=dict)
    outputs: list[EngineCoreOutput] = field(default_factory=list)


def run_to_completion(core: EngineCore, max_steps: int = 10_000, check: bool = True) -> RunResult:
    result = RunResult()
    for _ in range(max_steps):
        if not core.has_unfinished_requests():
            return result
        for out in core.step():
            result.outputs.append(out)
            result.tokens.setdefault(out.req_id, []).extend(out.new_token_ids)
            if out.finished:
                assert out.req_id not in result.finish_reasons, "finished twice"
                result.finish_reasons[out.req_id] = out.finish_reason  # type: ignore[assignment]
                result.stop_reasons[out.req_id] = out.stop_reason
        if check:
            check_invariants(core.scheduler)
    raise AssertionError(f"requests still unfinished after {max_steps} steps (livelock?)")


def check_invariants(scheduler: Scheduler) -> None:
    """Block ownership and queue consistency; raises AssertionError on any violation."""
    kv = scheduler.kv
    pool = kv.pool
    owners: Counter[int] = Counter()
    for req_id, blocks in kv.req_to_blocks.items():
        ids = [b.block_id for b in blocks]
        assert ids == kv.req_to_block_ids[req_id], f"{req_id}: block id list out of sync"
        assert len(set(ids)) == len(ids), f"{req_id} holds a block twice: {ids}"
        assert 0 not in ids, f"{req_id} holds the null block"
        owners.update(ids)
    assert set(kv.req_to_block_ids) == set(kv.req_to_blocks)
    free_ids = pool.free_queue.block_ids()
    assert len(free_ids) == len(set(free_ids)) == pool.num_free_blocks, "free queue corrupt"
    for block in pool.blocks[1:]:
        assert block.ref_cnt == owners[block.block_id], f"{block}: {owners[block.block_id]} owners"
        assert (block.ref_cnt == 0) == (block.block_id in free_ids), f"{block} free state wrong"
        if owners[block.block_id] > 1:
            assert block.block_hash is not None, f"uncached {block} is shared"
    for block_hash, block in pool.cached_blocks.items():
        assert block.block_hash == block_hash
    assert pool.num_free_blocks + len(owners) == pool.num_usable_blocks
    # Only running requests hold blocks; queued ones hold none.
    running_ids = {r.req_id for r in scheduler.running}
    assert set(kv.req_to_blocks) <= running_ids, "a non-running request holds blocks"
    waiting = list(scheduler.waiting)
    assert len(waiting) == len(scheduler.waiting)
    assert running_ids.isdisjoint(r.req_id for r in waiting)
    assert len(running_ids) + len(waiting) == len(scheduler.requests)
    assert len(scheduler.running) <= scheduler.config.max_num_seqs
