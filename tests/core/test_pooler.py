"""``Pooler``: one vector per finished prompt from a step's packed hidden states, exact on
CPU with a stand-in model whose hidden state at position p is ``[p, 1]``: last-token and
mean pooling over chunks, a preempted request recomputed from a cached position (rows
already summed are not counted twice), and the placeholder token that ends it."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import pytest
import torch
from engine.core.request import ReqId, Request
from engine.core.scheduler_output import ScheduledRequest, SchedulerOutput
from engine.model_executor.pooler import PLACEHOLDER_TOKEN_ID, Pooler
from engine.model_executor.pooling_task import PoolingConfig
from engine.sampling_params import SamplingParams


@dataclass
class _Inputs:
    input_ids: torch.Tensor
    positions: torch.Tensor
    attn_batch: Any = None


class _Backend:
    def build_metadata(self, batch: Any) -> None:
        return None


class _Runner:
    """Packs the step's tokens as the real runner does; hidden state of position p: [p, 1]."""

    attention_backends = [_Backend()]
    kv_caches: list[torch.Tensor] = []

    def prepare_inputs(self, so: SchedulerOutput) -> _Inputs:
        positions = [sr.start_position + i for sr in so.scheduled for i in range(sr.num_tokens)]
        ids = [t for sr in so.scheduled for t in sr.token_ids]
        return _Inputs(torch.tensor(ids), torch.tensor(positions))

    def model(self, input_ids: Any, positions: torch.Tensor, caches: Any, meta: Any) -> Any:
        return torch.stack([positions.float(), torch.ones(len(positions))], dim=1)


def _step(*chunks: tuple[str, int, int, bool]) -> SchedulerOutput:
    """chunks: (req_id, start_position, num_tokens, prompt complete)."""
    scheduled = []
    for req_id, start, n, done in chunks:
        req = Request(ReqId(req_id), [5] * 20, SamplingParams(max_tokens=1))
        scheduled.append(ScheduledRequest(req.req_id, [5] * n, start, [0], done, req))
    return SchedulerOutput(scheduled, sum(c[2] for c in chunks))


def _pooler(kind: str) -> Pooler:
    return Pooler(PoolingConfig("p", kind, normalize=True, embedding_size=2))


def test_last_and_mean_over_chunks_of_a_packed_step() -> None:
    runner = _Runner()
    last, mean = _pooler("last"), _pooler("mean")
    assert last.execute(runner, _step(("a", 0, 4, False), ("b", 0, 3, True))).pooled == {
        ReqId("b"): [2.0, 1.0]
    }
    out = last.execute(runner, _step(("a", 4, 2, True)))
    assert out.pooled == {ReqId("a"): [5.0, 1.0]}
    assert out.sampled_token_ids == {ReqId("a"): PLACEHOLDER_TOKEN_ID}
    mean.execute(runner, _step(("a", 0, 4, False), ("b", 0, 3, True)))
    out = mean.execute(runner, _step(("a", 4, 2, True)))
    assert out.pooled == {ReqId("a"): [pytest.approx(2.5), 1.0]}  # mean of 0..5


def test_mean_after_preemption_skips_rows_already_summed() -> None:
    runner, mean = _Runner(), _pooler("mean")
    mean.execute(runner, _step(("a", 0, 8, False)))
    mean.execute(runner, _step(("a", 8, 4, False)))  # summed [0, 12), then preempted
    # recomputed from cached position 8 (its own blocks): rows 8..11 again, then 12..15
    out = mean.execute(runner, _step(("a", 8, 8, True)))
    assert out.pooled == {ReqId("a"): [pytest.approx(7.5), 1.0]}  # mean of 0..15
    mean.drop({ReqId("a")})
    with pytest.raises(RuntimeError, match="never computed"):
        mean.execute(runner, _step(("a", 4, 2, True)))
