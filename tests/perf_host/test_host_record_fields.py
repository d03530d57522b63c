"""The hot paths build these records with positional arguments (about twice as fast as
keywords); this pins the field order they rely on, so a field added in the middle fails
here instead of shifting values silently."""

from __future__ import annotations

from dataclasses import fields

from engine.core.outputs import EngineCoreOutput
from engine.core.scheduler_output import ScheduledRequest
from engine.outputs import CompletionOutput, RequestOutput


def _names(cls: type) -> list[str]:
    return [f.name for f in fields(cls)]


def test_engine_core_output_order() -> None:  # Scheduler._apply_step
    assert _names(EngineCoreOutput)[:12] == [
        "req_id",
        "new_token_ids",
        "new_logprobs",
        "new_prompt_logprobs",
        "finish_reason",
        "stop_reason",
        "num_cached_tokens",
        "arrival_time",
        "first_scheduled_time",
        "first_token_time",
        "timestamp",
        "num_preemptions",
    ]


def test_scheduled_request_order() -> None:  # Scheduler._add_scheduled
    assert _names(ScheduledRequest)[:6] == [
        "req_id",
        "token_ids",
        "start_position",
        "block_ids",
        "sample",
        "request",
    ]


def test_output_records_order() -> None:  # RequestState / ParentRequest.take_output
    assert _names(CompletionOutput)[:9] == [
        "index",
        "text",
        "token_ids",
        "finish_reason",
        "stop_reason",
        "logprobs",
        "delta_text",
        "delta_token_ids",
        "delta_logprobs",
    ]
    assert _names(RequestOutput)[:8] == [
        "request_id",
        "prompt",
        "prompt_token_ids",
        "outputs",
        "finished",
        "prompt_logprobs",
        "num_cached_tokens",
        "error",
    ]
