"""Structured outputs offline (``LLM.generate`` / ``LLM.chat``) and the runner's reasoning
gate: no mask while the think section is open, the constraint right after its end marker,
and a matcher rebuilt from the output after preemption."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import jsonschema
import pytest
import torch
from engine.core.request import ReqId, Request
from engine.core.scheduler_output import ScheduledRequest
from engine.entrypoints.llm import LLM
from engine.plugins import PluginManager
from engine.sampling_params import SamplingParams, StructuredOutputsParams
from engine.structured_output import StructuredOutputManager
from engine.structured_output.runner_state import ReasoningGate, StructuredOutputState

pytestmark = pytest.mark.timeout(300)

SCHEMA = {
    "type": "object",
    "properties": {"ok": {"type": "boolean"}, "tag": {"type": "string", "maxLength": 5}},
    "required": ["ok", "tag"],
    "additionalProperties": False,
}


def _llm(model: Path, **extra: Any) -> LLM:
    return LLM(
        str(model), device="cpu", dtype="float32", max_model_len=512,
        kv_cache_memory_bytes=4 << 20, **extra,
    )  # fmt: skip


@pytest.fixture(scope="module")
def llm(tiny_model: Path) -> LLM:
    return _llm(tiny_model)


@pytest.fixture(scope="module")
def thinking_llm(tiny_model: Path) -> LLM:
    """With --reasoning-parser qwen3: constraints wait for the end of the think section."""
    return _llm(tiny_model, reasoning_parser="qwen3")


def test_generate_json_regex_choice(llm: LLM) -> None:
    constraint = StructuredOutputsParams(json=SCHEMA)
    params = [
        SamplingParams(max_tokens=150, seed=s, structured_outputs=constraint) for s in range(3)
    ]
    for out in llm.generate(["Hi", "The quick", "Numbers"], params, use_tqdm=False):
        assert out.outputs[0].finish_reason == "stop"
        jsonschema.validate(json.loads(out.outputs[0].text), SCHEMA)
    regex = SamplingParams(
        max_tokens=20,
        temperature=0,
        structured_outputs=StructuredOutputsParams(regex=r"[0-9]{2}[xy]"),
    )
    [out] = llm.generate("Code:", regex, use_tqdm=False)
    assert re.fullmatch(r"[0-9]{2}[xy]", out.outputs[0].text)
    choice = SamplingParams(
        max_tokens=10, n=2, seed=0, structured_outputs=StructuredOutputsParams(choice=["A", "BB"])
    )
    [out] = llm.generate("Pick:", choice, use_tqdm=False)
    assert {o.text for o in out.outputs} <= {"A", "BB"}
    # Unconstrained requests in the same batch are left alone.
    free = SamplingParams(max_tokens=5, temperature=0, ignore_eos=True)
    outs = llm.generate(["Hi", "Hi"], [free, regex], use_tqdm=False)
    assert len(outs[0].outputs[0].token_ids) == 5
    assert re.fullmatch(r"[0-9]{2}[xy]", outs[1].outputs[0].text)


def test_chat_thinking_prompt_closed_constrains_from_start(thinking_llm: LLM) -> None:
    # A template that closes the think section in the prompt (Qwen3 with
    # enable_thinking=False) makes the constraint apply from the first token.
    template = (Path(__file__).parent / "thinking_template.jinja").read_text()
    constraint = StructuredOutputsParams(json=SCHEMA)
    params = SamplingParams(max_tokens=150, seed=1, structured_outputs=constraint)
    [out] = thinking_llm.chat(
        [{"role": "user", "content": "hi"}], params, use_tqdm=False, chat_template=template,
        chat_template_kwargs={"enable_thinking": False},
    )  # fmt: skip
    jsonschema.validate(json.loads(out.outputs[0].text), SCHEMA)
    # Thinking left open and a model that never closes it: nothing is constrained.
    [out] = thinking_llm.chat(
        [{"role": "user", "content": "hi"}], params.clone(max_tokens=12, ignore_eos=True),
        use_tqdm=False, chat_template=template,
    )  # fmt: skip
    assert len(out.outputs[0].token_ids) == 12 and not out.outputs[0].text.startswith("{")


def test_logit_bias_offline(llm: LLM) -> None:
    params = SamplingParams(temperature=0.0, max_tokens=3, ignore_eos=True, logit_bias={51: 100})
    [out] = llm.generate("Hello", params, use_tqdm=False)
    assert out.outputs[0].token_ids == [51, 51, 51]
    with pytest.raises(ValueError, match="logit_bias"):
        llm.generate("x", SamplingParams(logit_bias={10**6: 1.0}), use_tqdm=False)
    with pytest.raises(ValueError, match="logit_bias"):
        llm.generate("x", SamplingParams(logit_bias={5: 150.0}), use_tqdm=False)
    assert not llm.engine.has_unfinished_requests()


def test_invalid_constraints_raise_value_error(llm: LLM) -> None:
    with pytest.raises(ValueError, match="grammar"):
        llm.generate(
            "x",
            SamplingParams(structured_outputs=StructuredOutputsParams(grammar='root ::= "a"')),
            use_tqdm=False,
        )
    with pytest.raises(ValueError, match="structured_outputs.json"):
        llm.generate(
            "x",
            SamplingParams(structured_outputs=StructuredOutputsParams(json="{not json")),
            use_tqdm=False,
        )
    assert not llm.engine.has_unfinished_requests()


# -- the runner's state, driven directly ------------------------------------------------------


@pytest.fixture(scope="module")
def tokenizer(tiny_model: Path) -> Any:
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(str(tiny_model))


def _state(tokenizer: Any, reasoning: bool) -> StructuredOutputState:
    pm = PluginManager.load()
    manager = StructuredOutputManager(tokenizer, len(tokenizer), pm, eos_token_ids=[0])
    parser_cls = pm.registry.resolve("reasoning_parser", "qwen3")
    gate = ReasoningGate(parser_cls(tokenizer), tokenizer) if reasoning else None
    state = StructuredOutputState(lambda: manager, lambda tok: gate)
    return state


def _scheduled(req: Request) -> ScheduledRequest:
    return ScheduledRequest(req.req_id, [0], req.num_tokens - 1, [0], True, req)


def _ids(tokenizer: Any, text: str) -> list[int]:
    return list(tokenizer.encode(text, add_special_tokens=False))


def _masks(state: Any, requests: list[Any], vocab_size: int) -> list[Any] | None:
    """The runner state's packed masks for the CPU, unpacked to bool rows; ``None`` for a
    row that allows every id (an unconstrained one)."""
    packed = state.masks(requests, vocab_size, torch.device("cpu"))
    if packed is None:
        return None
    return [None if bool(row.all()) else row for row in ~packed.forbidden()]


def test_reasoning_gate_masks_only_after_think_end(tokenizer: Any) -> None:
    state = _state(tokenizer, reasoning=True)
    params = SamplingParams(structured_outputs=StructuredOutputsParams(regex="ab"))
    req = Request(ReqId("r"), _ids(tokenizer, "<|im_start|>assistant\n"), params)
    vocab = len(tokenizer)
    a_id, b_id = _ids(tokenizer, "a")[0], _ids(tokenizer, "b")[0]
    for text in ("<think>", "hmm"):  # thinking: no mask, whatever is sampled
        assert _masks(state, [_scheduled(req)], vocab) is None
        req.output_token_ids += _ids(tokenizer, text)
        state.accept([_scheduled(req)], [req.output_token_ids[-1]])
    end = _ids(tokenizer, "</think>")
    assert len(end) == 1, "the tiny tokenizer has </think> as one token"
    assert _masks(state, [_scheduled(req)], vocab) is None
    req.output_token_ids += end
    [mask] = _masks(state, [_scheduled(req)], vocab) or [None]
    assert mask is not None and mask[a_id] and not mask[b_id] and int(mask.sum()) == 1
    state.accept([_scheduled(req)], [a_id])
    req.output_token_ids.append(a_id)
    [mask] = _masks(state, [_scheduled(req)], vocab) or [None]
    assert mask is not None and mask[b_id] and int(mask.sum()) == 1
    # Preempted: the state is dropped and rebuilt from the output (reasoning found again).
    state.drop([req.req_id])
    [mask] = _masks(state, [_scheduled(req)], vocab) or [None]
    assert mask is not None and mask[b_id] and int(mask.sum()) == 1


def test_prompt_that_closed_thinking_is_constrained_at_once(tokenizer: Any) -> None:
    state = _state(tokenizer, reasoning=True)
    params = SamplingParams(structured_outputs=StructuredOutputsParams(regex="ab"))
    prompt = _ids(tokenizer, "<|im_start|>assistant\n<think>\n\n</think>\n\n")
    req = Request(ReqId("r"), prompt, params)
    [mask] = _masks(state, [_scheduled(req)], len(tokenizer)) or [None]
    assert mask is not None and int(mask.sum()) == 1
    plain = Request(ReqId("p"), prompt, SamplingParams())
    masks = _masks(state, [_scheduled(plain), _scheduled(req)], len(tokenizer))
    assert masks is not None and masks[0] is None and masks[1] is not None
