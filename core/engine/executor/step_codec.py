"""Steps and results as plain JSON between the engine process and its workers (no pickle).

Request data never travels as pickles (a worker must not unpickle what a client could
shape). The engine sends each ``SchedulerOutput`` as a dict; workers keep a mirror of
every running request, so a step carries only what changed since the request was last
sent::

    first time a request is scheduled:  prompt_token_ids, sampling_params, whole tables
    later steps:                         new output tokens, new block ids (kept prefix + new)

    block_ids sent [3, 8]   now [3, 8, 5]   ->  num_kept_block_ids 2, new_block_ids [5]
    after a preemption the table is new     ->  num_kept_block_ids 0, new_block_ids [...]

A request in ``finished_req_ids`` is dropped on both sides before the step's requests are
read, so a request finished and re-sent in one step starts fresh.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field, fields
from typing import Any

from engine.core.request import ReqId, Request
from engine.core.scheduler_output import (
    Logprobs,
    ModelRunnerOutput,
    ScheduledRequest,
    SchedulerOutput,
)
from engine.sampling_params import SamplingParams, StructuredOutputsParams

__all__ = [
    "StepDecoder",
    "StepEncoder",
    "dumps",
    "loads",
    "runner_output_from_dict",
    "runner_output_to_dict",
    "sampling_params_from_dict",
    "sampling_params_to_dict",
]


def dumps(message: dict[str, Any]) -> bytes:
    return json.dumps(message, separators=(",", ":")).encode()


def loads(data: bytes) -> dict[str, Any]:
    message = json.loads(data)
    if not isinstance(message, dict):
        raise ValueError(f"expected a JSON object, got {type(message).__name__}")
    return message


def sampling_params_to_dict(params: SamplingParams) -> dict[str, Any]:
    return asdict(params)


def sampling_params_from_dict(data: dict[str, Any]) -> SamplingParams:
    known = {f.name for f in fields(SamplingParams)}
    values = {k: v for k, v in data.items() if k in known}
    structured = values.pop("structured_outputs", None)
    if structured is not None:
        values["structured_outputs"] = StructuredOutputsParams(**structured)
    return SamplingParams(**values)


@dataclass
class _Sent:
    num_output_tokens: int = 0
    block_ids: list[int] = field(default_factory=list)


class StepEncoder:
    """Engine side: what each worker already knows of every running request."""

    def __init__(self) -> None:
        self._sent: dict[ReqId, _Sent] = {}

    @property
    def num_tracked(self) -> int:
        return len(self._sent)

    def encode(self, so: SchedulerOutput) -> dict[str, Any]:
        for req_id in so.finished_req_ids:
            self._sent.pop(req_id, None)
        return {
            "op": "execute",
            "finished_req_ids": sorted(so.finished_req_ids),
            "preempted_req_ids": sorted(so.preempted_req_ids),
            "num_scheduled_tokens": so.num_scheduled_tokens,
            "scheduled": [self._encode_request(sr) for sr in so.scheduled],
        }

    def _encode_request(self, sr: ScheduledRequest) -> dict[str, Any]:
        entry: dict[str, Any] = {
            "req_id": sr.req_id,
            "token_ids": sr.token_ids,
            "start_position": sr.start_position,
            "sample": sr.sample,
        }
        request = sr.request
        sent = self._sent.get(sr.req_id)
        if sent is None:
            sent = self._sent[sr.req_id] = _Sent()
            entry["prompt_token_ids"] = request.prompt_token_ids
            entry["sampling_params"] = sampling_params_to_dict(request.sampling_params)
        outputs = request.output_token_ids
        kept = sent.num_output_tokens if sent.num_output_tokens <= len(outputs) else 0
        entry["num_kept_output_token_ids"] = kept
        entry["new_output_token_ids"] = outputs[kept:]
        num_blocks = len(sent.block_ids)
        kept_blocks = num_blocks if sr.block_ids[:num_blocks] == sent.block_ids else 0
        entry["num_kept_block_ids"] = kept_blocks
        entry["new_block_ids"] = sr.block_ids[kept_blocks:]
        sent.num_output_tokens = len(outputs)
        sent.block_ids = list(sr.block_ids)
        return entry


class StepDecoder:
    """Worker side: rebuilds each ``SchedulerOutput`` from the mirrored requests."""

    def __init__(self) -> None:
        self.requests: dict[ReqId, Request] = {}
        self.block_tables: dict[ReqId, list[int]] = {}

    def decode(self, message: dict[str, Any]) -> SchedulerOutput:
        finished = {ReqId(r) for r in message["finished_req_ids"]}
        for req_id in finished:
            self.requests.pop(req_id, None)
            self.block_tables.pop(req_id, None)
        scheduled = [self._decode_request(entry) for entry in message["scheduled"]]
        return SchedulerOutput(
            scheduled=scheduled,
            num_scheduled_tokens=int(message["num_scheduled_tokens"]),
            finished_req_ids=finished,
            preempted_req_ids={ReqId(r) for r in message["preempted_req_ids"]},
        )

    def _decode_request(self, entry: dict[str, Any]) -> ScheduledRequest:
        req_id = ReqId(entry["req_id"])
        if "sampling_params" in entry:
            params = sampling_params_from_dict(entry["sampling_params"])
            self.requests[req_id] = Request(req_id, list(entry["prompt_token_ids"]), params)
            self.block_tables[req_id] = []
        request = self.requests.get(req_id)
        if request is None:
            raise ValueError(f"step names request {req_id!r} that this worker never received")
        del request.output_token_ids[entry["num_kept_output_token_ids"] :]
        request.output_token_ids.extend(entry["new_output_token_ids"])
        table = self.block_tables[req_id]
        del table[entry["num_kept_block_ids"] :]
        table.extend(entry["new_block_ids"])
        request.num_computed_tokens = int(entry["start_position"])
        return ScheduledRequest(
            req_id=req_id,
            token_ids=list(entry["token_ids"]),
            start_position=int(entry["start_position"]),
            block_ids=list(table),
            sample=bool(entry["sample"]),
            request=request,
        )


def _logprobs_from_dict(data: dict[str, Any]) -> Logprobs:
    return Logprobs(
        token_id=int(data["token_id"]),
        logprob=float(data["logprob"]),
        rank=int(data["rank"]),
        top_token_ids=[int(t) for t in data["top_token_ids"]],
        top_logprobs=[float(v) for v in data["top_logprobs"]],
    )


def runner_output_to_dict(output: ModelRunnerOutput) -> dict[str, Any]:
    return {
        "sampled_token_ids": output.sampled_token_ids,
        "logprobs": {k: asdict(v) for k, v in output.logprobs.items()},
        "prompt_logprobs": {k: [asdict(lp) for lp in v] for k, v in output.prompt_logprobs.items()},
        "pooled": output.pooled,
    }


def runner_output_from_dict(data: dict[str, Any]) -> ModelRunnerOutput:
    return ModelRunnerOutput(
        sampled_token_ids={ReqId(k): int(v) for k, v in data["sampled_token_ids"].items()},
        logprobs={ReqId(k): _logprobs_from_dict(v) for k, v in data["logprobs"].items()},
        prompt_logprobs={
            ReqId(k): [_logprobs_from_dict(lp) for lp in v]
            for k, v in data["prompt_logprobs"].items()
        },
        pooled={ReqId(k): [float(x) for x in v] for k, v in data.get("pooled", {}).items()},
    )
