"""Vectorised step packing equals the per-request reference; the persistent block tables
of ``StepInputsBuilder`` equal whole copies through preemption, aborts and reuse of ids."""

from __future__ import annotations

import random
from typing import Any

import numpy as np
import pytest
import torch
from engine.core.kv_cache import KVCacheConfig
from engine.core.request import ReqId, Request, RequestStatus
from engine.core.scheduler import Scheduler
from engine.core.scheduler_config import SchedulerConfig
from engine.core.scheduler_output import ModelRunnerOutput, ScheduledRequest, SchedulerOutput
from engine.model_executor.inputs import (
    PersistentBlockTables,
    StepInputs,
    StepInputsBuilder,
    build_step_inputs,
)
from engine.sampling_params import SamplingParams

CPU = torch.device("cpu")


def reference_inputs(so: SchedulerOutput, bs: int, done: dict[ReqId, int]) -> dict[str, Any]:
    """The step inputs computed one request and one token at a time."""
    ids, positions, slots, query_start, seq_lens = [], [], [], [0], []
    prompt_rows, prompt_targets, sample_rows = [], [], []
    for sr in so.scheduled:
        first_row = len(ids)
        for k, token in enumerate(sr.token_ids):
            p = sr.start_position + k
            ids.append(token)
            positions.append(p)
            slots.append(sr.block_ids[p // bs] * bs + p % bs)
        query_start.append(len(ids))
        seq_lens.append(sr.start_position + sr.num_tokens)
        if sr.request.sampling_params.prompt_logprobs is not None:
            prompt = sr.request.prompt_token_ids
            first = max(sr.start_position, done.get(sr.req_id, 0))
            last = min(sr.start_position + sr.num_tokens, len(prompt) - 1)
            if first < last:
                prompt_rows += [first_row + p - sr.start_position for p in range(first, last)]
                prompt_targets.append((sr.req_id, prompt[first + 1 : last + 1]))
                done[sr.req_id] = sr.start_position + sr.num_tokens
        if sr.sample:
            sample_rows.append(len(ids) - 1)
    num_cols = max((-(-n // bs) for n in seq_lens), default=0)
    table = [
        list(sr.block_ids[: -(-n // bs)]) + [0] * (num_cols - -(-n // bs))
        for sr, n in zip(so.scheduled, seq_lens, strict=True)
    ]
    return {
        "input_ids": ids,
        "positions": positions,
        "slot_mapping": slots,
        "query_start_loc": query_start,
        "seq_lens": seq_lens,
        "block_tables": table,
        "logits_indices": prompt_rows + sample_rows,
        "num_prompt_rows": len(prompt_rows),
        "prompt_targets": prompt_targets,
        "sample_req_ids": [sr.req_id for sr in so.scheduled if sr.sample],
    }


def as_dict(inputs: StepInputs) -> dict[str, Any]:
    b = inputs.attn_batch
    assert inputs.input_ids.dtype == torch.int64 and inputs.positions.dtype == torch.int64
    assert b.slot_mapping.dtype == torch.int64 and inputs.logits_indices.dtype == torch.int64
    assert b.query_start_loc.dtype == torch.int32 and b.seq_lens.dtype == torch.int32
    assert b.block_tables.dtype == torch.int32 and b.block_tables.dim() == 2
    assert b.query_start_loc_cpu == b.query_start_loc.tolist()
    assert b.seq_lens_cpu == b.seq_lens.tolist()
    assert b.num_seqs == len(b.seq_lens) and b.num_tokens == len(inputs.input_ids)
    assert b.max_seq_len == max(b.seq_lens_cpu, default=0)
    for t in (
        inputs.input_ids,
        inputs.positions,
        b.query_start_loc,
        b.seq_lens,
        b.slot_mapping,
        b.block_tables,
        inputs.logits_indices,
    ):
        assert t.is_contiguous() and t.data_ptr() % 16 == 0
    return {
        "input_ids": inputs.input_ids.tolist(),
        "positions": inputs.positions.tolist(),
        "slot_mapping": b.slot_mapping.tolist(),
        "query_start_loc": b.query_start_loc.tolist(),
        "seq_lens": b.seq_lens.tolist(),
        "block_tables": b.block_tables.tolist(),
        "logits_indices": inputs.logits_indices.tolist(),
        "num_prompt_rows": inputs.num_prompt_rows,
        "prompt_targets": [(r.req_id, r.target_token_ids) for r in inputs.prompt_rows],
        "sample_req_ids": [sr.req_id for sr in inputs.sample_requests],
    }


def random_step(rng: random.Random, bs: int) -> SchedulerOutput:
    scheduled = []
    for i in range(rng.randrange(0, 9)):
        prompt_len = rng.randrange(2, 40)
        params = SamplingParams(prompt_logprobs=rng.choice([None, None, 2]))
        req = Request(ReqId(f"r{i}"), [rng.randrange(100) for _ in range(prompt_len)], params)
        start = rng.randrange(0, prompt_len + 10)
        n = 1 if rng.random() < 0.5 else rng.randrange(1, 12)
        num_blocks = -(-(start + n) // bs) + rng.choice([0, 0, 0, 2])  # some longer tables
        blocks = rng.sample(range(1, 500), num_blocks)
        tokens = [rng.randrange(100) for _ in range(n)]
        sample = start + n >= prompt_len or rng.random() < 0.3
        scheduled.append(ScheduledRequest(req.req_id, tokens, start, blocks, sample, req))
    return SchedulerOutput(scheduled, sum(s.num_tokens for s in scheduled))


@pytest.mark.parametrize("seed", range(40))
def test_packing_matches_the_reference(seed: int) -> None:
    rng = random.Random(seed)
    bs = rng.choice([1, 4, 16])
    so = random_step(rng, bs)
    done_ref: dict[ReqId, int] = {}
    done: dict[ReqId, int] = {}
    expected = reference_inputs(so, bs, done_ref)
    assert as_dict(build_step_inputs(so, bs, CPU, done)) == expected
    assert done == done_ref
    builder = StepInputsBuilder(bs, CPU)
    assert as_dict(builder.build(so, {})) == expected


def test_a_table_that_does_not_reach_the_last_token_is_an_error() -> None:
    req = Request(ReqId("a"), [1, 2, 3, 4, 5], SamplingParams())
    so = SchedulerOutput([ScheduledRequest(req.req_id, [5], 4, [3], True, req)], 1)
    with pytest.raises(ValueError, match="position 4 is beyond its block table"):
        build_step_inputs(so, 4, CPU, {})
    with pytest.raises(ValueError, match="position 4 is beyond its block table"):
        StepInputsBuilder(4, CPU).build(so, {})


class RandomRunner:
    def __init__(self, builder: StepInputsBuilder, bs: int, seed: int) -> None:
        self.builder, self.bs, self.rng = builder, bs, random.Random(seed)
        self.num_steps = 0

    def execute(self, so: SchedulerOutput) -> ModelRunnerOutput:
        self.num_steps += 1
        expected = reference_inputs(so, self.bs, {})
        assert as_dict(self.builder.build(so, {})) == expected
        out = ModelRunnerOutput()
        for sr in so.scheduled:
            if sr.sample:
                out.sampled_token_ids[sr.req_id] = self.rng.randrange(1, 50)
        return out


@pytest.mark.parametrize("seed", range(6))
def test_builder_equals_whole_copies_through_preemption_and_aborts(seed: int) -> None:
    """A small pool forces preemption (new tables for resumed requests); aborts and reused
    request ids retire rows; prefix caching makes new tables share old block ids."""
    rng = random.Random(seed)
    bs = 4
    sched = Scheduler(
        SchedulerConfig(max_num_seqs=6, max_num_batched_tokens=24, max_model_len=64),
        KVCacheConfig(num_blocks=24, block_size=bs, enable_prefix_caching=True),
    )
    builder = StepInputsBuilder(bs, CPU)
    runner = RandomRunner(builder, bs, seed)
    shared = [rng.randrange(1, 50) for _ in range(8)]
    next_id = 0
    for _ in range(150):
        if rng.random() < 0.3 and len(sched.requests) < 10:
            req_id = ReqId(f"r{rng.randrange(next_id + 1)}")  # sometimes a finished id again
            if req_id in sched.requests:
                req_id = ReqId(f"r{next_id}")
            next_id += 1
            prompt = shared[: rng.randrange(0, 9)] + [rng.randrange(1, 50) for _ in range(6)]
            params = SamplingParams(max_tokens=rng.randrange(1, 30), ignore_eos=True)
            sched.add_request(Request(req_id, prompt, params))
        if rng.random() < 0.05 and sched.running:
            victim = rng.choice(sched.running).req_id
            sched.finish_requests(victim, RequestStatus.FINISHED_ABORTED)
        so = sched.schedule()
        if so.is_empty:
            continue
        sched.update_from_output(so, runner.execute(so))
    assert sched.num_preemptions > 0 and runner.num_steps > 50
    # Rows of requests that left are retired (the last ids arrive with the next step).
    assert builder.block_tables.num_tracked <= len(sched.running) + 6


def test_a_replaced_table_is_rewritten_without_notice() -> None:
    """The guard: a request whose table changed under a kept row gets its row rewritten."""
    tables = PersistentBlockTables(initial_rows=1, initial_cols=2)
    req = Request(ReqId("a"), [1] * 9, SamplingParams())

    def gather(blocks: list[int], start: int) -> list[list[int]]:
        sr = ScheduledRequest(req.req_id, [1], start, blocks, True, req)
        table = tables.gather([sr], np.array([-(-(start + 1) // 4)]), 4)
        return table.tolist()

    assert gather([7, 2], 4) == [[7, 2]]
    assert gather([7, 2, 9], 8) == [[7, 2, 9]]  # appended; the array grew columns
    assert gather([7, 5, 3], 8) == [[7, 5, 3]]  # replaced: last held id differs
    tables.drop([ReqId("a")])
    assert tables.num_tracked == 0
    assert gather([4], 0) == [[4]]
