"""Async scheduling end to end through ``LLM`` on a tiny random model (CPU): every
sampling feature gives the same tokens, logprobs and finish reasons with
``async_scheduling`` on as with it off, and nothing past a stop is delivered or counted."""

from __future__ import annotations

from typing import Any

import pytest
from engine import LLM, SamplingParams
from engine_sdk.testing.models import build_tiny_model

BASE = {"device": "cpu", "dtype": "float32", "block_size": 4, "kv_cache_memory_bytes": 1 << 20}
PROMPTS = ["Hello world! How are you today?", "The quick brown fox", "A", "Numbers: 1 2 3 4"]


@pytest.fixture(scope="module")
def llms(tmp_path_factory: pytest.TempPathFactory) -> dict[bool, LLM]:
    path = build_tiny_model(tmp_path_factory.mktemp("qwen3"), "Qwen3ForCausalLM")
    return {mode: LLM(str(path), async_scheduling=mode, **BASE) for mode in (True, False)}


def _run(llm: LLM, params: SamplingParams | list[SamplingParams]) -> list[Any]:
    return [o.outputs[0] for o in llm.generate(PROMPTS, params, use_tqdm=False)]


def _summary(outs: list[Any]) -> list[tuple[Any, ...]]:
    return [(o.token_ids, o.text, o.finish_reason, o.stop_reason) for o in outs]


def test_async_is_on_by_default_and_off_on_request(llms: dict[bool, LLM]) -> None:
    assert llms[True].engine.engine_core.async_scheduling
    assert not llms[False].engine.engine_core.async_scheduling


def test_stop_conditions_are_exact(llms: dict[bool, LLM]) -> None:
    greedy = SamplingParams(temperature=0.0, max_tokens=12, ignore_eos=True)
    ref = _run(llms[False], greedy)
    # A stop token id, a stop string and min_tokens taken from the sync outputs.
    stop_id = ref[0].token_ids[4]
    first = ref[0].token_ids.index(stop_id)
    stop_text = ref[1].text[len(ref[1].text) // 2 :][:3]
    cases = [
        SamplingParams(temperature=0.0, max_tokens=5, ignore_eos=True),
        SamplingParams(temperature=0.0, max_tokens=12, ignore_eos=True, stop_token_ids=[stop_id]),
        SamplingParams(temperature=0.0, max_tokens=12, ignore_eos=True, stop=[stop_text]),
        SamplingParams(
            temperature=0.0,
            max_tokens=12,
            ignore_eos=True,
            stop_token_ids=[ref[2].token_ids[0]],
            min_tokens=3,
        ),
    ]
    for params in cases:
        before = {m: llm.counters().num_generation_tokens for m, llm in llms.items()}
        outs = {m: _run(llm, params) for m, llm in llms.items()}
        assert _summary(outs[True]) == _summary(outs[False]), params
        for mode, llm in llms.items():  # no token of a step after the stop is counted
            counted = llm.counters().num_generation_tokens - before[mode]
            assert counted == sum(len(o.token_ids) for o in outs[mode])
    stopped = _run(llms[True], cases[1])[0]
    assert stopped.token_ids == ref[0].token_ids[: first + 1]
    assert stopped.finish_reason == "stop" and stopped.stop_reason == stop_id
    assert len(_run(llms[True], cases[0])[0].token_ids) == 5


def test_penalties_seeds_and_logprobs_match(llms: dict[bool, LLM]) -> None:
    cases = [
        SamplingParams(temperature=0.0, max_tokens=10, ignore_eos=True, repetition_penalty=1.5),
        SamplingParams(
            temperature=0.0, max_tokens=10, ignore_eos=True, presence_penalty=1.0,
            frequency_penalty=0.5,
        ),
        SamplingParams(temperature=0.9, top_p=0.9, max_tokens=10, ignore_eos=True, seed=7),
        SamplingParams(temperature=0.0, max_tokens=6, ignore_eos=True, logprobs=3,
                       prompt_logprobs=2),
    ]  # fmt: skip
    for params in cases:
        outs = {m: llm.generate(PROMPTS, params, use_tqdm=False) for m, llm in llms.items()}
        for a, b in zip(outs[True], outs[False], strict=True):
            assert a.outputs[0].token_ids == b.outputs[0].token_ids, params
            if params.logprobs is not None:
                for x, y in zip(a.outputs[0].logprobs, b.outputs[0].logprobs, strict=True):
                    assert (x.token_id, x.rank, x.top_token_ids) == (
                        y.token_id, y.rank, y.top_token_ids,
                    )  # fmt: skip
                    assert x.logprob == pytest.approx(y.logprob, abs=1e-5)
                pa, pb = a.prompt_logprobs, b.prompt_logprobs
                assert [p and p.token_id for p in pa] == [p and p.token_id for p in pb]
                assert len(pa) == len(a.prompt_token_ids)


def test_abort_mid_generation(llms: dict[bool, LLM]) -> None:
    engine = llms[True].engine
    greedy = SamplingParams(temperature=0.0, max_tokens=20, ignore_eos=True)
    for i, prompt in enumerate(PROMPTS[:2]):
        engine.add_request(f"abort-{i}", prompt, greedy)
    seen: dict[str, int] = {}
    for _ in range(4):
        for out in engine.step():
            seen[out.request_id] = len(out.outputs[0].token_ids)
    engine.abort_request("abort-0")
    after: list[str] = []
    while engine.has_unfinished_requests():
        after += [o.request_id for o in engine.step()]
    assert "abort-0" not in after and "abort-1" in after
    s = llms[True].stats()
    assert s.num_running == 0 and s.num_free_blocks == s.num_total_blocks


def test_structured_outputs_match(llms: dict[bool, LLM]) -> None:
    """The grammar state for step N+1 depends on token N: masks are built after the step
    in flight is applied (its forward pass ran meanwhile), and outputs equal the sync ones."""
    import re

    from engine.sampling_params import StructuredOutputsParams

    params = SamplingParams(
        temperature=0.8,
        seed=11,
        max_tokens=12,
        structured_outputs=StructuredOutputsParams(regex=r"[0-9]{2}[xy]-[a-c]{3}"),
    )
    outs = {m: _run(llm, params) for m, llm in llms.items()}
    assert _summary(outs[True]) == _summary(outs[False])
    for out in outs[True]:
        assert re.fullmatch(r"[0-9]{2}[xy]-[a-c]{3}", out.text), out.text
