"""Output processor over fake core outputs: deltas, stop strings, n > 1 fan-in, aborts."""

from __future__ import annotations

from typing import Any

from engine.core.outputs import EngineCoreOutput
from engine.core.request import ReqId
from engine.fan_out import child_params, child_req_ids
from engine.outputs import Logprobs
from engine.outputs_processing import IterationStats, OutputProcessor
from engine.sampling_params import RequestOutputKind, SamplingParams


def _out(req_id: str, token: int | None, finish: str | None = None, **kw: Any) -> Any:
    return EngineCoreOutput(
        ReqId(req_id), [] if token is None else [token], finish_reason=finish, **kw
    )


def _register(proc: OutputProcessor, rid: str, prompt: list[int], params: SamplingParams) -> None:
    ids = child_req_ids(rid, params.n)
    proc.add_request(
        rid,
        None,
        prompt,
        list(zip(ids, child_params(params, params.n), [None] * params.n, strict=True)),
    )


def test_streaming_deltas_rebuild_the_text(byte_tokenizer: Any) -> None:
    tok = byte_tokenizer
    proc = OutputProcessor(tok)
    prompt = tok.encode("hello", add_special_tokens=False)
    gen = tok.encode(" 世界 😀 the fox", add_special_tokens=False)
    _register(proc, "r", prompt, SamplingParams(max_tokens=len(gen)))
    deltas, last = [], None
    for i, t in enumerate(gen):
        finish = "length" if i == len(gen) - 1 else None
        res = proc.process_outputs([_out("r", t, finish)])
        assert len(res.request_outputs) == 1 and not res.req_ids_to_finish
        last = res.request_outputs[0]
        comp = last.outputs[0]
        assert comp.delta_token_ids == [t]
        assert "\ufffd" not in comp.delta_text
        deltas.append(comp.delta_text)
    assert last is not None and last.finished
    assert last.outputs[0].text == "".join(deltas) == " 世界 😀 the fox"
    assert last.outputs[0].token_ids == gen and last.outputs[0].finish_reason == "length"
    assert not proc.has_unfinished_requests()


def test_stop_string_finishes_request_in_core(byte_tokenizer: Any) -> None:
    tok = byte_tokenizer
    proc = OutputProcessor(tok)
    gen = tok.encode(" the answer\nEND tail", add_special_tokens=False)
    _register(proc, "r", [5], SamplingParams(stop=["\nEND"], max_tokens=100))
    shown = ""
    for t in gen:
        res = proc.process_outputs([_out("r", t)])
        out = res.request_outputs[0]
        shown += out.outputs[0].delta_text
        assert "\nE" not in shown
        if out.finished:
            assert res.req_ids_to_finish == ["r"]
            break
    assert out.finished and out.outputs[0].finish_reason == "stop"
    assert out.outputs[0].stop_reason == "\nEND"
    assert out.outputs[0].text == shown == " the answer"
    # A late output for the finished request (same step) is ignored.
    assert proc.process_outputs([_out("r", 3)]).request_outputs == []


def test_stop_string_in_same_step_as_core_finish_is_not_finished_twice(
    byte_tokenizer: Any,
) -> None:
    tok = byte_tokenizer
    proc = OutputProcessor(tok)
    gen = tok.encode("xyz", add_special_tokens=False)
    _register(proc, "r", [5], SamplingParams(stop=["z"], max_tokens=len(gen)))
    res = None
    for i, t in enumerate(gen):
        res = proc.process_outputs([_out("r", t, "length" if i == len(gen) - 1 else None)])
    assert res is not None and res.req_ids_to_finish == []
    comp = res.request_outputs[0].outputs[0]
    assert (comp.finish_reason, comp.stop_reason, comp.text) == ("stop", "z", "xy")


def test_eos_stop_reason_and_logprobs(byte_tokenizer: Any) -> None:
    proc = OutputProcessor(byte_tokenizer)
    _register(proc, "r", [5, 6, 7], SamplingParams(logprobs=1, prompt_logprobs=0))
    lp = [Logprobs(token_id=i, logprob=-0.5 * i, rank=1) for i in range(3)]
    plp = [Logprobs(token_id=6, logprob=-1.0, rank=2), Logprobs(token_id=7, logprob=-2.0, rank=3)]
    r1 = proc.process_outputs(
        [_out("r", 40, new_logprobs=[lp[0]], new_prompt_logprobs=plp, num_cached_tokens=0)]
    ).request_outputs[0]
    eos = byte_tokenizer.eos_token_id
    r2 = proc.process_outputs(
        [_out("r", eos, "stop", new_logprobs=[lp[1]], stop_reason=None)]
    ).request_outputs[0]
    assert r1.prompt_logprobs == [None, *plp]
    assert r1.outputs[0].delta_logprobs == [lp[0]]
    assert r2.outputs[0].logprobs == lp[:2] and r2.outputs[0].delta_logprobs == [lp[1]]
    assert r2.outputs[0].token_ids == [40, eos]
    assert r2.outputs[0].text == byte_tokenizer.decode([40])  # EOS skipped as special
    assert r2.finished and r2.outputs[0].finish_reason == "stop"


def test_n_greater_than_one_fans_in(byte_tokenizer: Any) -> None:
    params = SamplingParams(n=3, seed=10, max_tokens=2)
    kids = child_params(params, 3)
    assert [k.seed for k in kids] == [10, 11, 12] and all(k.n == 1 for k in kids)
    assert [k.seed for k in child_params(SamplingParams(n=2), 2)] == [None, None]
    assert child_req_ids("a", 3) == ["a-0", "a-1", "a-2"] and child_req_ids("a", 1) == ["a"]

    proc = OutputProcessor(byte_tokenizer)
    _register(proc, "a", [5], params)
    it = IterationStats(scheduler=None)
    res = proc.process_outputs([_out("a-0", 40), _out("a-2", 41, "length")], it)
    (out,) = res.request_outputs
    assert out.request_id == "a" and not out.finished
    assert [c.index for c in out.outputs] == [0, 1, 2]
    assert [c.delta_token_ids for c in out.outputs] == [[40], [], [41]]
    assert it.num_generation_tokens == 2 and len(it.finished_requests) == 1
    assert it.num_prompt_tokens == 1  # the shared prompt counts once
    (out,) = proc.process_outputs([_out("a-0", 42, "length"), _out("a-1", 43)]).request_outputs
    assert not out.finished and [c.token_ids for c in out.outputs] == [[40, 42], [43], [41]]
    (out,) = proc.process_outputs([_out("a-1", 44, "length")]).request_outputs
    assert out.finished and [c.delta_token_ids for c in out.outputs] == [[], [44], []]
    assert not proc.has_unfinished_requests()


def test_abort_returns_core_ids_and_final_output(byte_tokenizer: Any) -> None:
    proc = OutputProcessor(byte_tokenizer)
    _register(proc, "a", [5], SamplingParams(n=2))
    proc.process_outputs([_out("a-1", 40, "length")])
    outs, core_ids = proc.abort_requests(["a", "unknown"])
    assert core_ids == ["a-0"]
    assert outs[0].finished and [c.finish_reason for c in outs[0].outputs] == ["abort", "length"]
    assert not proc.has_unfinished_requests()


def test_duplicate_request_id_rejected(byte_tokenizer: Any) -> None:
    import pytest

    proc = OutputProcessor(byte_tokenizer)
    _register(proc, "a", [5], SamplingParams())
    with pytest.raises(ValueError, match="already running"):
        _register(proc, "a", [5], SamplingParams())


def _run_kind(tok: Any, kind: RequestOutputKind, n: int = 1) -> list[Any]:
    proc = OutputProcessor(tok)
    gen = tok.encode(" 世界 the fox", add_special_tokens=False)
    params = SamplingParams(max_tokens=len(gen), n=n, logprobs=0, output_kind=kind)
    _register(proc, "r", [5], params)
    outputs = []
    for i, t in enumerate(gen):
        finish = "length" if i == len(gen) - 1 else None
        core = [_out(rid, t, finish, new_logprobs=[Logprobs(t, -0.1, 1)])
                for rid in child_req_ids("r", n)]  # fmt: skip
        outputs += proc.process_outputs(core).request_outputs
    assert not proc.has_unfinished_requests()
    return outputs


def test_delta_outputs_hold_only_what_is_new(byte_tokenizer: Any) -> None:
    tok = byte_tokenizer
    outs = _run_kind(tok, RequestOutputKind.DELTA, n=2)
    gen = tok.encode(" 世界 the fox", add_special_tokens=False)
    for index in range(2):
        pieces = [o.outputs[index] for o in outs]
        assert all(len(p.token_ids) <= 1 for p in pieces)  # never the whole sequence
        assert [t for p in pieces for t in p.token_ids] == gen
        assert "".join(p.text for p in pieces) == " 世界 the fox"
        assert all(p.text == p.delta_text and p.token_ids is p.delta_token_ids for p in pieces)
        assert [lp.token_id for p in pieces for lp in p.logprobs or []] == gen
        assert pieces[-1].finish_reason == "length"


def test_final_only_gives_one_whole_output(byte_tokenizer: Any) -> None:
    tok = byte_tokenizer
    outs = _run_kind(tok, RequestOutputKind.FINAL_ONLY, n=2)
    gen = tok.encode(" 世界 the fox", add_special_tokens=False)
    assert len(outs) == 1 and outs[0].finished
    for c in outs[0].outputs:
        assert c.text == " 世界 the fox" and c.token_ids == gen
        assert len(c.logprobs or []) == len(gen)


def test_cumulative_is_the_default(byte_tokenizer: Any) -> None:
    tok = byte_tokenizer
    outs = _run_kind(tok, SamplingParams().output_kind)
    gen = tok.encode(" 世界 the fox", add_special_tokens=False)
    assert len(outs) == len(gen)
    assert [len(o.outputs[0].token_ids) for o in outs] == list(range(1, len(gen) + 1))
    assert outs[-1].outputs[0].text == " 世界 the fox"
