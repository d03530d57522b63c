"""Token budget, sequence cap, chunked prefill and the long-prefill threshold, step by step."""

from __future__ import annotations

import pytest
from core_fakes import make_core, make_request, reference_tokens, run_to_completion


def test_long_prompt_is_chunked_exactly_by_the_budget() -> None:
    core, runner = make_core(max_num_batched_tokens=10)
    prompt = list(range(1, 26))  # 25 tokens
    core.add_request(make_request("a", prompt, max_tokens=3))
    result = run_to_completion(core)
    assert [s.scheduled for s in runner.steps] == [
        [("a", 0, 10, False)],
        [("a", 10, 10, False)],
        [("a", 20, 5, True)],
        [("a", 25, 1, True)],
        [("a", 26, 1, True)],
    ]
    assert result.tokens["a"] == reference_tokens(prompt, 3)
    assert result.finish_reasons["a"] == "length"


def test_running_first_then_waiting_fill_the_rest_of_the_budget() -> None:
    core, runner = make_core(max_num_batched_tokens=10)
    a, b = list(range(1, 8)), list(range(30, 42))  # 7 and 12 tokens
    core.add_request(make_request("a", a, max_tokens=3))
    core.add_request(make_request("b", b, max_tokens=2))
    result = run_to_completion(core)
    assert [s.scheduled for s in runner.steps] == [
        [("a", 0, 7, True), ("b", 0, 3, False)],
        [("a", 7, 1, True), ("b", 3, 9, True)],
        [("a", 8, 1, True), ("b", 12, 1, True)],
    ]
    assert result.tokens == {"a": reference_tokens(a, 3), "b": reference_tokens(b, 2)}


def test_without_chunking_a_prompt_that_does_not_fit_waits() -> None:
    core, runner = make_core(
        max_num_batched_tokens=16, max_model_len=16, enable_chunked_prefill=False
    )
    a, b = list(range(1, 7)), list(range(40, 52))  # 6 and 12 tokens
    core.add_request(make_request("a", a, max_tokens=2))
    core.add_request(make_request("b", b, max_tokens=1))
    result = run_to_completion(core)
    assert [s.scheduled for s in runner.steps] == [
        [("a", 0, 6, True)],  # b (12) does not fit the remaining 10
        [("a", 6, 1, True), ("b", 0, 12, True)],
    ]
    assert result.tokens == {"a": reference_tokens(a, 2), "b": reference_tokens(b, 1)}


def test_long_prefill_token_threshold_caps_each_request_per_step() -> None:
    core, runner = make_core(max_num_batched_tokens=64, long_prefill_token_threshold=4)
    a, b = list(range(1, 11)), list(range(20, 26))  # 10 and 6 tokens
    core.add_request(make_request("a", a, max_tokens=1))
    core.add_request(make_request("b", b, max_tokens=1))
    result = run_to_completion(core)
    assert [s.scheduled for s in runner.steps] == [
        [("a", 0, 4, False), ("b", 0, 4, False)],
        [("a", 4, 4, False), ("b", 4, 2, True)],
        [("a", 8, 2, True)],
    ]
    assert result.tokens == {"a": reference_tokens(a, 1), "b": reference_tokens(b, 1)}


def test_max_num_seqs_caps_the_batch() -> None:
    core, runner = make_core(max_num_seqs=2)
    for i in range(3):
        core.add_request(make_request(f"r{i}", [i + 1, i + 2], max_tokens=2))
    run_to_completion(core)
    assert [[r for r, *_ in s.scheduled] for s in runner.steps] == [
        ["r0", "r1"],
        ["r0", "r1"],
        ["r2"],
        ["r2"],
    ]
    assert runner.steps[2].finished_req_ids == {"r0", "r1"}


def test_config_errors_name_the_flags() -> None:
    with pytest.raises(ValueError, match="--max-num-batched-tokens.*--enable-chunked-prefill"):
        make_core(max_num_batched_tokens=8, max_model_len=16, enable_chunked_prefill=False)
    with pytest.raises(ValueError, match="--long-prefill-token-threshold"):
        make_core(max_model_len=16, enable_chunked_prefill=False, long_prefill_token_threshold=4)
    with pytest.raises(ValueError, match="--scheduling-policy"):
        make_core(policy="lifo")
    with pytest.raises(ValueError, match="--max-num-seqs"):
        make_core(max_num_seqs=0)
    with pytest.raises(ValueError, match="--max-model-len.*--kv-cache-memory-bytes"):
        make_core(num_blocks=4, block_size=4, max_model_len=16)  # 3 usable blocks: 12 tokens
