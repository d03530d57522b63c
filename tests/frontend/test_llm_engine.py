"""LLMEngine over the real scheduler/engine core with a scripted runner."""

from __future__ import annotations

from typing import Any

import pytest
from engine.entrypoints.llm import LLM
from engine.errors import RequestValidationError
from engine.outputs_processing import IterationStats
from engine.sampling_params import SamplingParams
from fake_runner import build_engine, scripted, seeded_random


def _run(engine: Any) -> dict[str, Any]:
    done = {}
    while engine.has_unfinished_requests():
        for out in engine.step():
            if out.finished:
                done[out.request_id] = out
    return done


def test_prompt_validation(byte_tokenizer: Any) -> None:
    eng = build_engine(byte_tokenizer, scripted([], byte_tokenizer.eos_token_id), max_model_len=32)
    with pytest.raises(RequestValidationError, match="prompt is empty"):
        eng.add_request("a", "")
    with pytest.raises(ValueError, match="prompt is empty"):
        eng.add_request("a", {"prompt_token_ids": []})
    with pytest.raises(ValueError, match=r"outside the vocabulary \[0, "):
        eng.add_request("a", [1, len(byte_tokenizer) + 5])
    with pytest.raises(ValueError, match="outside the vocabulary"):
        eng.add_request("a", [-1])
    msg = r"maximum context length is 32 tokens, but 30 output tokens .* prompt of 5 tokens \(35"
    with pytest.raises(ValueError, match=msg):
        eng.add_request("a", [1, 2, 3, 4, 5], SamplingParams(max_tokens=30))
    with pytest.raises(ValueError, match="temperature must be >= 0"):
        eng.add_request("a", [1], SamplingParams(temperature=-1))
    assert not eng.has_unfinished_requests()
    # max_tokens=None: as many as fit in the context.
    eng.add_request("b", [1, 2, 3, 4, 5], SamplingParams(max_tokens=None, ignore_eos=True))
    out = _run(eng)["b"]
    assert len(out.outputs[0].token_ids) == 32 - 5
    assert out.outputs[0].finish_reason == "length"


def test_stop_string_finishes_in_the_core_and_frees_blocks(byte_tokenizer: Any) -> None:
    tok = byte_tokenizer
    script = tok.encode(" the answer is 42\nEND of it all, more text", add_special_tokens=False)
    eng = build_engine(tok, scripted(script, tok.eos_token_id))
    eng.add_request("r", "hello world", SamplingParams(stop=["\nEND"], max_tokens=50))
    shown = ""
    while eng.has_unfinished_requests():
        for out in eng.step():
            shown += out.outputs[0].delta_text
            assert "\nE" not in shown
    comp = out.outputs[0]
    assert (comp.text, comp.finish_reason, comp.stop_reason) == (
        " the answer is 42",
        "stop",
        "\nEND",
    )
    assert len(comp.token_ids) < len(script)  # stopped by the string, not by length/EOS
    stats = eng.stats()
    assert stats.num_running == 0 and stats.num_free_blocks == stats.num_total_blocks


def test_eos_and_include_stop_str(byte_tokenizer: Any) -> None:
    tok = byte_tokenizer
    script = tok.encode(" alpha beta", add_special_tokens=False)
    eng = build_engine(tok, scripted(script, tok.eos_token_id))
    eng.add_request("eos", "hi", SamplingParams(max_tokens=40))
    eng.add_request("inc", "hi", SamplingParams(stop=["beta"], include_stop_str_in_output=True))
    done = _run(eng)
    assert done["eos"].outputs[0].text == " alpha beta"
    assert done["eos"].outputs[0].token_ids == [*script, tok.eos_token_id]
    assert done["eos"].outputs[0].finish_reason == "stop"
    assert done["inc"].outputs[0].text == " alpha beta"
    assert done["inc"].outputs[0].stop_reason == "beta"


def test_n_samples_with_seed_differ_and_reproduce(byte_tokenizer: Any) -> None:
    tok = byte_tokenizer
    vocab = range(10, len(tok) - 10)

    def sample(seed: int | None) -> list[list[int]]:
        eng = build_engine(tok, seeded_random(vocab))
        eng.add_request("r", "shared prompt text", SamplingParams(n=3, seed=seed, max_tokens=8))
        out = _run(eng)["r"]
        assert [c.index for c in out.outputs] == [0, 1, 2]
        assert all(c.finish_reason == "length" for c in out.outputs)
        return [c.token_ids for c in out.outputs]

    first = sample(7)
    assert len({tuple(t) for t in first}) == 3  # children got different seeds
    assert sample(7) == first  # and the whole request reproduces
    assert sample(8) != first
    # child i has seed + i: child 1 of seed 7 equals child 0 of seed 8
    assert sample(8)[0] == first[1]


def test_n_children_share_the_prompt_blocks(byte_tokenizer: Any) -> None:
    tok = byte_tokenizer
    eng = build_engine(tok, seeded_random(range(10, 200)), block_size=4)
    prompt = list(range(20, 60))  # 40 tokens: 10 full blocks
    eng.add_request("r", prompt, SamplingParams(n=4, seed=1, max_tokens=2))
    _run(eng)
    stats = eng.stats()
    # Children after the first find the prompt's full blocks in the prefix cache.
    assert stats.prefix_cache_hits > 0


def test_generation_config_defaults_apply_only_when_unset(byte_tokenizer: Any) -> None:
    eng = build_engine(
        byte_tokenizer,
        scripted([], byte_tokenizer.eos_token_id),
        sampling_defaults={"temperature": 0.3, "top_k": 5, "max_tokens": 7},
    )
    d = eng.default_sampling_params()
    assert (d.temperature, d.top_k, d.max_tokens) == (0.3, 5, 7)
    merged = eng.sampling_params_from_request({"temperature": 1.0, "max_tokens": None})
    assert (merged.temperature, merged.top_k, merged.max_tokens) == (1.0, 5, 7)


def test_abort_frees_blocks_and_reports(byte_tokenizer: Any) -> None:
    tok = byte_tokenizer
    eng = build_engine(tok, seeded_random(range(10, 200)))
    eng.add_request("a", list(range(20, 50)), SamplingParams(max_tokens=50, seed=1, n=2))
    eng.step()
    eng.step()
    assert eng.stats().num_free_blocks < eng.stats().num_total_blocks
    outs = eng.abort_request("a")
    assert outs[0].finished and {c.finish_reason for c in outs[0].outputs} == {"abort"}
    s = eng.stats()
    assert s.num_free_blocks == s.num_total_blocks and not eng.has_unfinished_requests()
    assert eng.counters().finished_by_reason == {"abort": 2}


def test_stats_listener_and_counters(byte_tokenizer: Any) -> None:
    tok = byte_tokenizer
    eng = build_engine(tok, scripted(tok.encode(" a b c", add_special_tokens=False), 0))
    records: list[IterationStats] = []
    eng.add_stats_listener(records.append)
    eng.add_request("x", "hello there", SamplingParams(max_tokens=3, ignore_eos=True))
    eng.add_request("y", "hi", SamplingParams(max_tokens=2, ignore_eos=True))
    _run(eng)
    assert sum(r.num_generation_tokens for r in records) == 5
    assert sum(len(r.time_to_first_tokens) for r in records) == 2
    assert sum(len(r.inter_token_latencies) for r in records) == 3
    finished = [f for r in records for f in r.finished_requests]
    assert sorted(f.req_id for f in finished) == ["x", "y"]
    fx = next(f for f in finished if f.req_id == "x")
    assert fx.num_generation_tokens == 3 and fx.finish_reason == "length"
    assert fx.queue_time is not None and fx.queue_time >= 0
    assert fx.e2e_latency >= (fx.time_to_first_token or 0) >= 0
    c = eng.counters()
    n_prompt = len(tok.encode("hello there")) + len(tok.encode("hi"))
    assert (c.num_generation_tokens, c.num_prompt_tokens) == (5, n_prompt)
    assert c.finished_by_reason == {"length": 2}


def test_offline_llm_order_and_params(byte_tokenizer: Any) -> None:
    tok = byte_tokenizer
    llm = LLM.from_engine(build_engine(tok, seeded_random(range(10, 200)), max_num_seqs=2))
    prompts = ["one", {"prompt_token_ids": [30, 31, 32]}, "three three three", [40, 41]]
    params = [SamplingParams(max_tokens=k, seed=k, ignore_eos=True) for k in (3, 1, 5, 2)]
    outs = llm.generate(prompts, params, use_tqdm=False)
    assert [len(o.outputs[0].token_ids) for o in outs] == [3, 1, 5, 2]
    assert outs[1].prompt_token_ids == [30, 31, 32] and outs[0].prompt == "one"
    with pytest.raises(ValueError, match="got 2 SamplingParams for 4 prompts"):
        llm.generate(prompts, params[:2])
    single = llm.generate("one", SamplingParams(max_tokens=3, seed=3, ignore_eos=True))
    assert single[0].outputs[0].token_ids == outs[0].outputs[0].token_ids


def test_offline_llm_several_prompts_times_n(byte_tokenizer: Any) -> None:
    """One request of the front end: ids offline-K-P, each prompt's n samples in order with
    seeds seed + i (as the prompt alone gets them), all prompts checked before any runs."""
    tok = byte_tokenizer
    llm = LLM.from_engine(build_engine(tok, seeded_random(range(10, 200))))
    params = SamplingParams(n=2, seed=5, max_tokens=3, ignore_eos=True)
    prompts: list[Any] = ["one", [30, 31, 32]]
    outs = llm.generate(prompts, params, use_tqdm=False)
    assert [o.request_id for o in outs] == ["offline-0-0", "offline-0-1"]
    for k, (prompt, out) in enumerate(zip(prompts, outs, strict=True)):
        [alone] = llm.generate(prompt, params, use_tqdm=False)
        assert alone.request_id == f"offline-{k + 1}"
        assert [c.index for c in out.outputs] == [0, 1]
        assert [c.token_ids for c in out.outputs] == [c.token_ids for c in alone.outputs]
        assert out.outputs[0].token_ids != out.outputs[1].token_ids  # seeds 5 and 6
    added = llm.counters().num_requests_added
    with pytest.raises(RequestValidationError, match="outside the vocabulary") as err:
        llm.generate(["fine", [10**6]], params, use_tqdm=False)
    assert err.value.param == "prompt"
    assert llm.counters().num_requests_added == added  # the good prompt never ran either
    assert llm.generate([], params) == []


def test_offline_chat_renders_template(byte_tokenizer: Any) -> None:
    tok = byte_tokenizer
    llm = LLM.from_engine(build_engine(tok, scripted([50, 51], tok.eos_token_id)))
    conv = [{"role": "user", "content": "Hi"}]
    outs = llm.chat([conv, conv], SamplingParams(max_tokens=4), use_tqdm=False)
    expected = tok.encode("<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n")
    assert outs[0].prompt_token_ids == expected and len(outs) == 2
    outs = llm.chat(conv, chat_template_kwargs={"enable_thinking": False})
    assert outs[0].prompt is not None and outs[0].prompt.endswith("</think>\n\n")


def test_offline_chat_template_file(byte_tokenizer: Any, tmp_path: Any) -> None:
    tok = byte_tokenizer
    llm = LLM.from_engine(build_engine(tok, scripted([50], tok.eos_token_id)))
    path = tmp_path / "plain.jinja"
    path.write_text("{% for m in messages %}{{ m['role'] }}: {{ m['content'] }}\n{% endfor %}")
    outs = llm.chat([{"role": "user", "content": "Hi"}], chat_template=str(path))
    assert outs[0].prompt == "user: Hi\n"


def test_llm_unknown_keyword_names_close_matches() -> None:
    with pytest.raises(TypeError, match="max_num_seq.*did you mean max_num_seqs"):
        LLM(model="/nonexistent", max_num_seq=4)
