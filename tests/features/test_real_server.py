"""Structured outputs, forced tool calls and reasoning through a real ``engine serve`` on a
tiny random model, with the official ``openai`` client. The model writes gibberish, so
whatever comes out valid comes out valid because of the constraint."""

from __future__ import annotations

import json
import re
import subprocess
from pathlib import Path
from typing import Any

import jsonschema
import openai
import pytest
from features_server import SERVER_FLAGS, Server, engine_cli

pytestmark = pytest.mark.timeout(300)

SCHEMA = {
    "type": "object",
    "properties": {
        "name": {"type": "string", "maxLength": 6},
        "ok": {"type": "boolean"},
        "color": {"enum": ["red", "green", "blue"]},
    },
    "required": ["name", "ok", "color"],
    "additionalProperties": False,
}
WEATHER = {
    "type": "object",
    "properties": {
        "city": {"type": "string", "enum": ["Paris", "Rome", "Oslo"]},
        "unit": {"type": "string", "enum": ["c", "f"]},
    },
    "required": ["city", "unit"],
    "additionalProperties": False,
}
TIME = {
    "type": "object",
    "properties": {"zone": {"type": "string", "maxLength": 4}},
    "required": ["zone"],
    "additionalProperties": False,
}
TOOLS: list[Any] = [
    {"type": "function", "function": {"name": "get_weather", "parameters": WEATHER}},
    {"type": "function", "function": {"name": "get_time", "parameters": TIME}},
]
MESSAGES: list[Any] = [{"role": "user", "content": "Hello"}]


def client(server: Server) -> openai.OpenAI:
    return openai.OpenAI(base_url=server.base_url + "/v1", api_key="none", max_retries=0)


@pytest.mark.parametrize("seed", [1, 2])
def test_json_schema_through_structured_outputs_and_response_format(
    tools_server: Server, seed: int
) -> None:
    c = client(tools_server)
    r = c.chat.completions.create(
        model="tiny", messages=MESSAGES, max_tokens=200, seed=seed, temperature=1.0,
        extra_body={"structured_outputs": {"json": SCHEMA}},
    )  # fmt: skip
    assert r.choices[0].finish_reason == "stop"
    jsonschema.validate(json.loads(r.choices[0].message.content or ""), SCHEMA)
    response_format: Any = {
        "type": "json_schema",
        "json_schema": {"name": "thing", "schema": SCHEMA, "strict": True},
    }
    r = c.chat.completions.create(
        model="tiny", messages=MESSAGES, max_tokens=200, seed=seed,
        response_format=response_format,
    )  # fmt: skip
    jsonschema.validate(json.loads(r.choices[0].message.content or ""), SCHEMA)


def test_json_object(tools_server: Server) -> None:
    r = client(tools_server).chat.completions.create(
        model="tiny", messages=MESSAGES, max_tokens=300, seed=3, temperature=0.7,
        response_format={"type": "json_object"},
    )  # fmt: skip
    if r.choices[0].finish_reason == "stop":
        assert isinstance(json.loads(r.choices[0].message.content or ""), dict)
    else:  # cut at max_tokens: still an object's beginning
        assert (r.choices[0].message.content or "").startswith("{")


def test_regex_and_choice_on_completions(tools_server: Server) -> None:
    c = client(tools_server)
    pattern = r"[a-c]{2}-[0-9]{3}"
    for seed in (1, 2, 3):
        r = c.completions.create(
            model="tiny", prompt="The code is", max_tokens=30, seed=seed, temperature=1.0,
            extra_body={"structured_outputs": {"regex": pattern}},
        )  # fmt: skip
        assert re.fullmatch(pattern, r.choices[0].text), r.choices[0].text
    choices = ["yes", "no", "maybe later"]
    r = c.completions.create(
        model="tiny", prompt="Answer:", max_tokens=10, n=3, seed=4, temperature=1.0,
        extra_body={"structured_outputs": {"choice": choices}},
    )  # fmt: skip
    assert all(choice.text in choices for choice in r.choices)
    r = c.chat.completions.create(
        model="tiny", messages=MESSAGES, max_tokens=10,
        extra_body={"structured_outputs": {"choice": choices}},
    )  # fmt: skip
    assert r.choices[0].message.content in choices


def test_required_tool_choice_calls_validate(tools_server: Server) -> None:
    c = client(tools_server)
    schemas = {t["function"]["name"]: t["function"]["parameters"] for t in TOOLS}
    r = c.chat.completions.create(
        model="tiny", messages=MESSAGES, max_tokens=400, seed=5, tools=TOOLS,
        tool_choice="required",
    )  # fmt: skip
    choice = r.choices[0]
    assert choice.finish_reason == "tool_calls", choice
    calls = choice.message.tool_calls or []
    assert calls
    for call in calls:
        assert call.type == "function" and call.id.startswith("call_")
        jsonschema.validate(json.loads(call.function.arguments), schemas[call.function.name])
    stream = c.chat.completions.create(
        model="tiny", messages=MESSAGES, max_tokens=400, seed=5, tools=TOOLS,
        tool_choice="required", stream=True,
    )  # fmt: skip
    assert _reassemble(stream) == [(x.function.name, x.function.arguments) for x in calls]


@pytest.mark.parametrize("seed", [5, 6])
def test_required_tool_choice_with_parallel_tool_calls_false_makes_one_call(
    tools_server: Server, seed: int
) -> None:
    c = client(tools_server)
    args: Any = {
        "model": "tiny", "messages": MESSAGES, "max_tokens": 400, "seed": seed, "tools": TOOLS,
        "tool_choice": "required", "parallel_tool_calls": False, "temperature": 1.0,
    }  # fmt: skip
    choice = c.chat.completions.create(**args).choices[0]
    assert choice.finish_reason == "tool_calls", choice
    [call] = choice.message.tool_calls or []
    assert _reassemble(c.chat.completions.create(**args, stream=True)) == [
        (call.function.name, call.function.arguments)
    ]


def test_required_grammar_allows_one_or_more_calls_unless_parallel_is_off() -> None:
    from engine.entrypoints.openai.tool_choice import required_schema

    functions = {t["function"]["name"]: t["function"]["parameters"] for t in TOOLS}
    one = {"name": "get_time", "parameters": {"zone": "CET"}}
    two = [{"name": "get_weather", "parameters": {"city": "Oslo", "unit": "c"}}, one]
    jsonschema.validate(two, required_schema(functions))
    jsonschema.validate([one], required_schema(functions, parallel=False))
    with pytest.raises(jsonschema.ValidationError):
        jsonschema.validate(two, required_schema(functions, parallel=False))
    with pytest.raises(jsonschema.ValidationError):
        jsonschema.validate([], required_schema(functions))


def test_named_tool_choice_arguments_validate(tools_server: Server) -> None:
    c = client(tools_server)
    named: Any = {"type": "function", "function": {"name": "get_weather"}}
    r = c.chat.completions.create(
        model="tiny", messages=MESSAGES, max_tokens=200, seed=6, tools=TOOLS, tool_choice=named
    )
    [call] = r.choices[0].message.tool_calls or []
    assert call.function.name == "get_weather" and r.choices[0].finish_reason == "stop"
    assert r.choices[0].message.content is None
    jsonschema.validate(json.loads(call.function.arguments), WEATHER)
    stream = c.chat.completions.create(
        model="tiny", messages=MESSAGES, max_tokens=200, seed=6, tools=TOOLS, tool_choice=named,
        stream=True,
    )  # fmt: skip
    # A named call finishes with "stop", as OpenAI (and vLLM) answer.
    assert _reassemble(stream, "stop") == [("get_weather", call.function.arguments)]


def _reassemble(stream: Any, finish_reason: str = "tool_calls") -> list[tuple[str, str]]:
    calls: dict[int, list[str]] = {}
    finish = None
    for chunk in stream:
        for choice in chunk.choices:
            for tc in choice.delta.tool_calls or []:
                entry = calls.setdefault(tc.index, ["", ""])
                if tc.function is not None:
                    entry[0] += tc.function.name or ""
                    entry[1] += tc.function.arguments or ""
            finish = choice.finish_reason or finish
    assert finish == finish_reason
    return [(calls[i][0], calls[i][1]) for i in sorted(calls)]


def test_grammar_is_refused_naming_no_internal_library(tools_server: Server) -> None:
    with pytest.raises(openai.BadRequestError) as info:
        client(tools_server).chat.completions.create(
            model="tiny", messages=MESSAGES, max_tokens=5,
            extra_body={"structured_outputs": {"grammar": 'root ::= "a"'}},
        )  # fmt: skip
    message = str(info.value)
    assert "grammar is not supported by this server" in message, message
    assert "outlines" not in message, message  # issue 17: no internal library names


def test_invalid_schema_and_guided_fields_are_400(tools_server: Server) -> None:
    c = client(tools_server)
    with pytest.raises(openai.BadRequestError) as info:
        c.chat.completions.create(
            model="tiny", messages=MESSAGES, max_tokens=5,
            extra_body={"structured_outputs": {"json": {"type": "no-such-type"}}},
        )  # fmt: skip
    assert "structured_outputs.json" in str(info.value)
    with pytest.raises(openai.BadRequestError) as info:
        c.completions.create(
            model="tiny", prompt="x", max_tokens=5, extra_body={"guided_json": {"type": "object"}}
        )
    assert "guided_json was removed" in str(info.value)


def test_reasoning_server_requests_succeed(reasoning_server: Server) -> None:
    c = client(reasoning_server)
    r = c.chat.completions.create(model="tiny", messages=MESSAGES, max_tokens=8)
    assert r.choices[0].finish_reason in ("stop", "length")
    assert r.usage is not None and r.usage.completion_tokens >= 1
    # Thinking off: the prompt closes the think section, so the constraint applies from
    # the first token and the whole output is content.
    r = c.chat.completions.create(
        model="tiny", messages=MESSAGES, max_tokens=200, seed=7,
        extra_body={"structured_outputs": {"json": SCHEMA},
                    "chat_template_kwargs": {"enable_thinking": False}},
    )  # fmt: skip
    message: Any = r.choices[0].message
    jsonschema.validate(json.loads(message.content or ""), SCHEMA)
    assert getattr(message, "reasoning_content", None) is None


def _serve(model: Path, *flags: str) -> subprocess.CompletedProcess[str]:
    cmd = [*engine_cli(), "serve", str(model), *SERVER_FLAGS, "--port", "1", *flags]
    return subprocess.run(cmd, capture_output=True, text=True, timeout=120)


def test_startup_errors(tiny_model: Path, tmp_path: Path) -> None:
    done = _serve(tiny_model, "--enable-auto-tool-choice")
    assert done.returncode != 0 and "--tool-call-parser" in done.stderr
    done = _serve(tiny_model, "--enable-auto-tool-choice", "--tool-call-parser", "nope")
    assert done.returncode != 0
    assert "'nope' is not installed" in done.stderr and "hermes" in done.stderr
    done = _serve(tiny_model, "--reasoning-parser", "nope")
    assert done.returncode != 0 and "qwen3" in done.stderr and "deepseek_r1" in done.stderr
    bad = tmp_path / "bad.py"
    bad.write_text("x = 1\n")
    done = _serve(tiny_model, "--tool-parser-plugin", str(bad), "--tool-call-parser", "x")
    assert done.returncode != 0 and "defines no tool parser" in done.stderr
