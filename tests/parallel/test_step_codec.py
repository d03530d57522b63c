"""The JSON step codec between the engine and tensor-parallel workers: requests are sent
whole once, then as deltas; finished requests are forgotten on both sides; outputs and
sampling params round-trip exactly; nothing is pickled."""

from __future__ import annotations

import json
import math

import pytest
from engine.core.request import ReqId, Request
from engine.core.scheduler_output import (
    Logprobs,
    ModelRunnerOutput,
    ScheduledRequest,
    SchedulerOutput,
)
from engine.executor.step_codec import (
    StepDecoder,
    StepEncoder,
    dumps,
    loads,
    runner_output_from_dict,
    runner_output_to_dict,
    sampling_params_from_dict,
    sampling_params_to_dict,
)
from engine.sampling_params import SamplingParams, StructuredOutputsParams


def _request(req_id: str, prompt: list[int], **params: object) -> Request:
    return Request(ReqId(req_id), prompt, SamplingParams(**params))  # type: ignore[arg-type]


def _sr(req: Request, token_ids: list[int], start: int, blocks: list[int]) -> ScheduledRequest:
    return ScheduledRequest(req.req_id, token_ids, start, blocks, True, req)


def _roundtrip(enc: StepEncoder, dec: StepDecoder, so: SchedulerOutput) -> SchedulerOutput:
    wire = dumps(enc.encode(so))
    return dec.decode(loads(wire))


def _assert_same(a: ScheduledRequest, b: ScheduledRequest) -> None:
    assert (b.req_id, b.token_ids, b.start_position, b.block_ids, b.sample) == (
        a.req_id,
        a.token_ids,
        a.start_position,
        a.block_ids,
        a.sample,
    )
    assert b.request.prompt_token_ids == a.request.prompt_token_ids
    assert b.request.output_token_ids == a.request.output_token_ids
    assert b.request.sampling_params == a.request.sampling_params


def test_requests_are_sent_whole_once_then_as_deltas() -> None:
    enc, dec = StepEncoder(), StepDecoder()
    a = _request("a", [5, 6, 7, 8, 9], temperature=0.0, max_tokens=4, logprobs=2)
    b = _request("b", [1, 2], seed=7, temperature=0.8, stop=["x"])
    step1 = SchedulerOutput([_sr(a, [5, 6, 7, 8, 9], 0, [3, 8]), _sr(b, [1, 2], 0, [4])], 7)
    out1 = _roundtrip(enc, dec, step1)
    for x, y in zip(step1.scheduled, out1.scheduled, strict=True):
        _assert_same(x, y)

    a.output_token_ids.append(11)
    b.output_token_ids.append(12)
    step2 = SchedulerOutput([_sr(a, [11], 5, [3, 8]), _sr(b, [12], 2, [4])], 2)
    message = enc.encode(step2)
    entry = message["scheduled"][0]
    assert "sampling_params" not in entry and "prompt_token_ids" not in entry
    assert entry["new_output_token_ids"] == [11] and entry["num_kept_output_token_ids"] == 0
    assert entry["new_block_ids"] == [] and entry["num_kept_block_ids"] == 2
    out2 = dec.decode(loads(dumps(message)))
    for x, y in zip(step2.scheduled, out2.scheduled, strict=True):
        _assert_same(x, y)
    # the mirrored request is the same object from step to step (history accumulates)
    assert out2.scheduled[0].request is out1.scheduled[0].request

    a.output_token_ids.append(13)
    step3 = SchedulerOutput([_sr(a, [13], 6, [3, 8, 5])], 1)
    message = enc.encode(step3)
    entry = message["scheduled"][0]
    assert entry["num_kept_block_ids"] == 2 and entry["new_block_ids"] == [5]
    assert entry["num_kept_output_token_ids"] == 1 and entry["new_output_token_ids"] == [13]
    _assert_same(step3.scheduled[0], dec.decode(loads(dumps(message))).scheduled[0])


def test_a_preempted_request_gets_a_new_block_table() -> None:
    enc, dec = StepEncoder(), StepDecoder()
    a = _request("a", [1, 2, 3, 4, 5], temperature=0.0)
    _roundtrip(enc, dec, SchedulerOutput([_sr(a, [1, 2, 3, 4, 5], 0, [9, 2])], 5))
    a.output_token_ids += [6, 7]
    # preempted, then recomputed from scratch in other blocks
    step = SchedulerOutput([_sr(a, [1, 2, 3, 4, 5, 6, 7], 0, [4, 1])], 7)
    step.preempted_req_ids = {a.req_id}
    message = enc.encode(step)
    assert message["scheduled"][0]["num_kept_block_ids"] == 0
    out = dec.decode(loads(dumps(message)))
    _assert_same(step.scheduled[0], out.scheduled[0])
    assert out.preempted_req_ids == {a.req_id}


def test_finished_requests_are_dropped_and_an_unknown_request_is_an_error() -> None:
    enc, dec = StepEncoder(), StepDecoder()
    a = _request("a", [1, 2], temperature=0.0)
    b = _request("b", [3], temperature=0.0)
    _roundtrip(enc, dec, SchedulerOutput([_sr(a, [1, 2], 0, [0]), _sr(b, [3], 0, [1])], 3))
    step = SchedulerOutput([_sr(b, [4], 1, [1])], 1, finished_req_ids={a.req_id})
    b.output_token_ids.append(4)
    out = _roundtrip(enc, dec, step)
    assert out.finished_req_ids == {a.req_id}
    assert set(dec.requests) == {b.req_id} and enc.num_tracked == 1
    # a request id reused after it finished is sent whole again
    a2 = _request("a", [7, 7, 7], temperature=0.5)
    out = _roundtrip(enc, dec, SchedulerOutput([_sr(a2, [7, 7, 7], 0, [2])], 3))
    _assert_same(SchedulerOutput([_sr(a2, [7, 7, 7], 0, [2])]).scheduled[0], out.scheduled[0])

    stray = {"req_id": "zzz", "token_ids": [1], "start_position": 0, "sample": True}
    stray |= {"num_kept_output_token_ids": 0, "new_output_token_ids": []}
    stray |= {"num_kept_block_ids": 0, "new_block_ids": [0]}
    message = {"finished_req_ids": [], "preempted_req_ids": [], "num_scheduled_tokens": 1}
    with pytest.raises(ValueError, match="zzz"):
        dec.decode({**message, "scheduled": [stray]})


def test_sampling_params_round_trip_through_json() -> None:
    params = SamplingParams(
        n=2,
        temperature=0.7,
        top_p=0.9,
        top_k=5,
        seed=3,
        stop=["a", "b"],
        stop_token_ids=[4],
        logprobs=3,
        prompt_logprobs=1,
        structured_outputs=StructuredOutputsParams(json={"type": "object"}),
        eos_token_ids=[1, 2],
    )
    data = json.loads(json.dumps(sampling_params_to_dict(params)))
    assert sampling_params_from_dict(data) == params


def test_runner_output_round_trips_including_infinite_logprobs() -> None:
    lp = Logprobs(5, -0.25, 1, [5, 9], [-0.25, -math.inf])
    output = ModelRunnerOutput(
        sampled_token_ids={ReqId("a"): 5, ReqId("b"): 0},
        logprobs={ReqId("a"): lp},
        prompt_logprobs={ReqId("b"): [lp, Logprobs(1, -3.5, 2)]},
        pooled={ReqId("c"): [0.25, -1.5]},  # an embedding model's vector (TP rank 0)
    )
    back = runner_output_from_dict(loads(dumps(runner_output_to_dict(output))))
    assert back == output


def test_the_wire_format_is_json_not_pickle() -> None:
    a = _request("a", [1, 2], temperature=0.0)
    wire = dumps(StepEncoder().encode(SchedulerOutput([_sr(a, [1, 2], 0, [0])], 2)))
    assert json.loads(wire)["op"] == "execute"
    with pytest.raises(ValueError, match="JSON object"):
        loads(b"[1, 2]")
