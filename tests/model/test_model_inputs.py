"""Step inputs: slot mapping, block tables, logits rows (exact values)."""

from __future__ import annotations

import torch
from engine.core.request import ReqId, Request
from engine.core.scheduler_output import ScheduledRequest, SchedulerOutput
from engine.model_executor.inputs import build_step_inputs
from engine.sampling_params import SamplingParams


def _sr(req: Request, tokens: list[int], start: int, blocks: list[int], sample: bool):
    return ScheduledRequest(req.req_id, tokens, start, blocks, sample, req)


def test_slots_positions_tables_and_logits_rows() -> None:
    a = Request(ReqId("a"), [1, 2, 3, 4, 5, 6], SamplingParams())
    b = Request(ReqId("b"), [9, 9, 9, 9, 9], SamplingParams(prompt_logprobs=1))
    so = SchedulerOutput(
        [
            _sr(a, [4, 5, 6], 3, [7, 2, 5], True),  # positions 3..5: slots 31, 8, 9
            _sr(b, [9, 9, 9], 0, [4, 1], False),  # a first chunk: no sample
        ],
        6,
    )
    done: dict = {}
    inputs = build_step_inputs(so, 4, torch.device("cpu"), done)
    assert inputs.input_ids.tolist() == [4, 5, 6, 9, 9, 9]
    assert inputs.positions.tolist() == [3, 4, 5, 0, 1, 2]
    batch = inputs.attn_batch
    assert batch.slot_mapping.tolist() == [31, 8, 9, 16, 17, 18]
    assert batch.query_start_loc.tolist() == [0, 3, 6]
    assert batch.seq_lens.tolist() == [6, 3]
    # Only the blocks the step's sequences reach: a uses 2 of 3, b 1 of 2.
    assert batch.block_tables.tolist() == [[7, 2], [4, 0]]
    assert (batch.max_query_len, batch.max_seq_len, batch.num_tokens) == (3, 6, 6)
    # Prompt rows first (b's positions 0..2 predict tokens 1..3), then a's sample row.
    assert inputs.logits_indices.tolist() == [3, 4, 5, 2]
    assert inputs.num_prompt_rows == 3
    assert inputs.prompt_rows[0].target_token_ids == [9, 9, 9]
    assert [sr.req_id for sr in inputs.sample_requests] == ["a"]
    assert done == {"b": 3}

    # b's last chunk: position 3 predicts token 4; position 4 (the last) predicts nothing.
    so2 = SchedulerOutput([_sr(b, [9, 9], 3, [4, 1], True)], 2)
    inputs2 = build_step_inputs(so2, 4, torch.device("cpu"), done)
    assert inputs2.logits_indices.tolist() == [0, 1]
    assert inputs2.prompt_rows[0].target_token_ids == [9]
    # A recompute of the same positions (after preemption) reports nothing twice.
    inputs3 = build_step_inputs(so2, 4, torch.device("cpu"), done)
    assert inputs3.prompt_rows == [] and inputs3.logits_indices.tolist() == [1]
