"""Stop conditions checked by the scheduler, and logprobs passed through."""

from __future__ import annotations

from core_fakes import make_core, make_request, reference_tokens, run_to_completion

PROMPT = [3, 1, 4, 1, 5, 9, 2, 6]
REF = reference_tokens(PROMPT, 40)


def _first_unique_index(start: int = 1) -> int:
    """An index i >= start whose token does not occur before it in the reference."""
    for i in range(start, len(REF)):
        if REF[i] not in REF[:i]:
            return i
    raise AssertionError("reference has no fresh token")


def _run(**params: object):  # type: ignore[no-untyped-def]
    core, _ = make_core()
    core.add_request(make_request("a", PROMPT, **params))  # type: ignore[arg-type]
    result = run_to_completion(core)
    return result.tokens["a"], result.finish_reasons["a"], result.stop_reasons["a"]


def test_max_tokens() -> None:
    assert _run(max_tokens=5) == (REF[:5], "length", None)


def test_eos_stops_unless_ignored() -> None:
    i = _first_unique_index()
    eos = REF[i]
    assert _run(max_tokens=30, eos_token_ids=[eos]) == (REF[: i + 1], "stop", None)
    assert _run(max_tokens=30, eos_token_ids=[eos], ignore_eos=True) == (REF[:30], "length", None)


def test_eos_not_before_min_tokens() -> None:
    i = _first_unique_index()
    eos = REF[i]
    later = [j for j in range(i + 1, 30) if REF[j] == eos]  # (j+1)-th output >= min_tokens
    tokens, reason, _ = _run(max_tokens=30, eos_token_ids=[eos], min_tokens=i + 2)
    if later:
        assert (tokens, reason) == (REF[: later[0] + 1], "stop")
    else:
        assert (tokens, reason) == (REF[:30], "length")
    assert len(tokens) >= i + 2


def test_stop_token_ids_set_stop_reason_and_respect_min_tokens() -> None:
    i = _first_unique_index()
    stop = REF[i]
    assert _run(max_tokens=30, stop_token_ids=[stop]) == (REF[: i + 1], "stop", stop)
    tokens, reason, stop_reason = _run(max_tokens=i + 1, stop_token_ids=[stop], min_tokens=i + 1)
    assert (tokens, reason, stop_reason) == (REF[: i + 1], "stop", stop)  # the last allowed one
    tokens, reason, _ = _run(max_tokens=i + 3, stop_token_ids=[stop], min_tokens=i + 2)
    assert len(tokens) >= i + 2 and tokens == REF[: len(tokens)]


def test_eos_on_the_last_allowed_token_is_a_stop() -> None:
    i = _first_unique_index()
    assert _run(max_tokens=i + 1, eos_token_ids=[REF[i]]) == (REF[: i + 1], "stop", None)


def test_max_model_len_finishes_with_length() -> None:
    core, _ = make_core(max_model_len=20)
    core.add_request(make_request("a", PROMPT, max_tokens=None))
    core.add_request(make_request("b", PROMPT, max_tokens=100))
    result = run_to_completion(core)
    assert result.tokens == {"a": REF[:12], "b": REF[:12]}  # 8 + 12 = 20 tokens
    assert result.finish_reasons == {"a": "length", "b": "length"}


def test_logprobs_and_prompt_logprobs_pass_through_chunks() -> None:
    core, _ = make_core(max_num_batched_tokens=3)
    core.add_request(make_request("a", PROMPT, max_tokens=3, logprobs=1, prompt_logprobs=0))
    result = run_to_completion(core)
    outs = result.outputs
    prompt_lps = [lp for o in outs for lp in (o.new_prompt_logprobs or [])]
    assert [lp.token_id for lp in prompt_lps] == PROMPT[1:]
    assert [lp.logprob for lp in prompt_lps] == [-float(p) for p in range(1, len(PROMPT))]
    sampled = [o for o in outs if o.new_token_ids]
    assert [o.new_logprobs[0].token_id for o in sampled] == REF[:3]  # type: ignore[index]
    # The first chunks carry prompt logprobs only; no token is emitted before the prompt ends.
    assert outs[0].new_token_ids == [] and outs[0].new_prompt_logprobs


def test_output_timestamps_and_counters() -> None:
    core, _ = make_core()
    core.add_request(make_request("a", PROMPT, max_tokens=3))
    result = run_to_completion(core)
    first, last = result.outputs[0], result.outputs[-1]
    assert first.first_scheduled_time is not None and first.first_token_time is not None
    assert first.arrival_time <= first.first_scheduled_time <= first.first_token_time
    assert last.first_token_time == first.first_token_time <= last.timestamp
    assert last.finished and not first.finished and last.num_preemptions == 0
