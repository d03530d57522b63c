"""The one fan-out (``engine.fan_out``) and the front end that applies it
(``InputProcessor.prepare_all``): ids, choice indexes, seeds, errors that name the field,
and the merge of the prompts' streams."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from typing import Any

import pytest
from engine.errors import RequestValidationError
from engine.fan_out import (
    child_params,
    child_req_ids,
    choice_index,
    merge_outputs,
    prompt_request_ids,
    split_choice,
)
from engine.outputs import CompletionOutput, RequestOutput
from engine.sampling_params import SamplingParams
from engine.tokenization.input_processor import InputProcessor


def test_ids_and_choice_indexes() -> None:
    assert prompt_request_ids("r", 1) == ["r"]
    assert prompt_request_ids("r", 3) == ["r-0", "r-1", "r-2"]
    assert child_req_ids("r", 1) == ["r"]
    assert child_req_ids("r-1", 2) == ["r-1-0", "r-1-1"]
    # prompt p, sample i -> p * n + i, and back
    assert [choice_index(p, 3, i) for p in range(2) for i in range(3)] == list(range(6))
    assert [split_choice(c, 3) for c in (0, 2, 3, 5)] == [(0, 0), (0, 2), (1, 0), (1, 2)]


def test_child_params_seed_each_sample() -> None:
    seeded = child_params(SamplingParams(n=3, seed=11, temperature=0.5), 3)
    assert [(p.n, p.seed, p.temperature) for p in seeded] == [
        (1, 11, 0.5),
        (1, 12, 0.5),
        (1, 13, 0.5),
    ]
    assert [p.seed for p in child_params(SamplingParams(n=2), 2)] == [None, None]


def _front(tokenizer: Any, max_model_len: int = 32) -> InputProcessor:
    return InputProcessor(tokenizer, max_model_len, len(tokenizer), [tokenizer.eos_token_id])


def test_prepare_all_fans_out_prompts_times_n(byte_tokenizer: Any) -> None:
    front = _front(byte_tokenizer)
    params = SamplingParams(n=2, seed=5, max_tokens=4)
    prepared = front.prepare_all(
        "r", ["ab", [7, 8, 9]], [params, params], priority=3, cache_salts=["s0", "s1"]
    )
    assert [p.request_id for p in prepared] == ["r-0", "r-1"]
    assert [[r.req_id for r in p.core_requests] for p in prepared] == [
        ["r-0-0", "r-0-1"],
        ["r-1-0", "r-1-1"],
    ]
    assert prepared[1].prompt is None and prepared[1].prompt_token_ids == [7, 8, 9]
    assert prepared[0].prompt == "ab"
    for p, salt in zip(prepared, ["s0", "s1"], strict=True):
        assert p.params.n == 2 and p.cache_salt == salt
        assert [r.sampling_params.seed for r in p.core_requests] == [5, 6]
        assert {(r.priority, r.cache_salt) for r in p.core_requests} == {(3, salt)}
        assert p.core_requests[0].prompt_token_ids == p.prompt_token_ids
    [single] = front.prepare_all("q", ["ab"], [SamplingParams(max_tokens=None)])
    assert single.request_id == "q" and [r.req_id for r in single.core_requests] == ["q"]
    assert single.params.max_tokens == 32 - len(single.prompt_token_ids)  # as many as fit


@pytest.mark.parametrize(
    "prompt,params,param,reason,needle",
    [
        ([1] * 30, SamplingParams(max_tokens=5), "max_tokens", "context_length_exceeded",
         "maximum context length is 32 tokens, but 5 output tokens"),
        ([1] * 32, SamplingParams(max_tokens=None), "prompt", "context_length_exceeded",
         "maximum context length is 32 tokens, but the prompt has 32 tokens"),
        ([1, 10**6], SamplingParams(), "prompt", None, "outside the vocabulary"),
        ([], SamplingParams(), "prompt", None, "the prompt is empty"),
        ([1], SamplingParams(temperature=-1), "temperature", None, "temperature must be >= 0"),
        ([1], SamplingParams(min_tokens=9, max_tokens=2), "min_tokens", None, "must not exceed"),
        ([1], SamplingParams(logit_bias={10**6: 1.0}), "logit_bias", None, "outside the vocab"),
    ],
)  # fmt: skip
def test_errors_name_the_field(
    byte_tokenizer: Any,
    prompt: list[int],
    params: SamplingParams,
    param: str,
    reason: str | None,
    needle: str,
) -> None:
    front = _front(byte_tokenizer)
    with pytest.raises(RequestValidationError, match=needle) as err:
        front.prepare_all("r", [[2, 3], prompt], [SamplingParams(), params])
    assert (err.value.param, err.value.reason) == (param, reason)


def _out(rid: str, text: str, finished: bool) -> RequestOutput:
    return RequestOutput(rid, None, [1], [CompletionOutput(0, text, [])], finished)


async def _stream(outs: list[RequestOutput | Exception], delay_s: float) -> Any:
    for out in outs:
        await asyncio.sleep(delay_s)
        if isinstance(out, Exception):
            raise out
        yield out


async def _collect(streams: list[AsyncIterator[RequestOutput]]) -> list[tuple[int, str]]:
    return [(p, out.outputs[0].text) async for p, out in merge_outputs(streams)]


def test_merge_tags_each_output_with_its_prompt_and_stops_at_finished() -> None:
    slow = _stream([_out("r-0", "a", False), _out("r-0", "b", True), _out("r-0", "x", True)], 0.02)
    fast = _stream([_out("r-1", "c", False), _out("r-1", "d", True)], 0.001)
    merged = asyncio.run(_collect([slow, fast]))
    assert merged[:2] == [(1, "c"), (1, "d")]  # as they come, not prompt by prompt
    assert merged[2:] == [(0, "a"), (0, "b")]  # nothing after a finished output
    single = _stream([_out("r", "a", True), _out("r", "x", True)], 0)
    assert asyncio.run(_collect([single])) == [(0, "a")]


def test_merge_raises_the_error_of_any_stream() -> None:
    good = _stream([_out("r-0", "a", False), _out("r-0", "b", True)], 0.05)
    bad = _stream([_out("r-1", "c", False), ValueError("engine said no")], 0.001)
    with pytest.raises(ValueError, match="engine said no"):
        asyncio.run(_collect([good, bad]))
