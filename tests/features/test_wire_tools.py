"""Tool calls on the wire through ``engine serve`` (scripted engine) and the ``openai``
client: arguments stream incrementally for every ``tool_choice``, one entry per index per
chunk, ``finish_reason`` and ``content`` as OpenAI sends them, ``parallel_tool_calls``."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import openai
import pytest
from features_server import Server, start_scripted_server

pytestmark = pytest.mark.timeout(300)

WEATHER = {
    "type": "object",
    "properties": {"city": {"type": "string"}, "days": {"type": "integer"}},
    "required": ["city"],
}
TIME = {"type": "object", "properties": {"zone": {"type": "string"}}, "required": ["zone"]}
TOOLS: list[Any] = [
    {"type": "function", "function": {"name": "get_weather", "parameters": WEATHER}},
    {"type": "function", "function": {"name": "get_time", "parameters": TIME}},
]
MESSAGES: list[Any] = [{"role": "user", "content": "Weather in Paris?"}]
NAMED: Any = {"type": "function", "function": {"name": "get_weather"}}
# Scripts, picked by the request's seed.
AUTO_TWO, REQUIRED_TWO, NAMED_ONE, AUTO_TEXT = 0, 1, 2, 3
SCRIPTS = [
    'Let me check. <tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris", '
    '"days": 3}}\n</tool_call>\n<tool_call>\n{"name": "get_time", "arguments": '
    '{"zone": "CET"}}\n</tool_call>',
    '[{"name": "get_weather", "parameters": {"city": "Paris", "days": 3}}, '
    '{"name": "get_time", "parameters": {"zone": "CET"}}]',
    '{"city": "Rome", "days": 2}',
    "No tool is needed for that.",
]
EXPECTED_TWO = [
    ("get_weather", {"city": "Paris", "days": 3}),
    ("get_time", {"zone": "CET"}),
]


@pytest.fixture(scope="module")
def server(tiny_model: Path) -> Iterator[Server]:
    s = start_scripted_server(
        tiny_model, SCRIPTS, "--enable-auto-tool-choice", "--tool-call-parser", "hermes"
    )
    yield s
    s.stop()


@pytest.fixture(scope="module")
def client(server: Server) -> openai.OpenAI:
    return openai.OpenAI(base_url=server.base_url + "/v1", api_key="none", max_retries=0)


def create(client: openai.OpenAI, script: int, **kw: Any) -> Any:
    return client.chat.completions.create(
        model="tiny", messages=MESSAGES, tools=TOOLS, seed=script, **kw
    )


def streamed(client: openai.OpenAI, script: int, **kw: Any) -> tuple[list[Any], dict[str, Any]]:
    """The chunks and the reassembled message; checks one entry per index per chunk."""
    chunks = list(create(client, script, stream=True, **kw))
    calls: dict[int, dict[str, Any]] = {}
    content, finish = "", None
    for chunk in chunks:
        for choice in chunk.choices:
            deltas = choice.delta.tool_calls or []
            indexes = [d.index for d in deltas]
            assert len(indexes) == len(set(indexes)), f"two entries for one index: {deltas}"
            for d in deltas:
                call = calls.setdefault(d.index, {"id": None, "name": "", "args": [], "n": 0})
                if d.id is not None:
                    assert call["id"] is None and d.type == "function" and d.function.name
                    call["id"] = d.id
                if d.function is not None:
                    call["name"] += d.function.name or ""
                    if d.function.arguments:
                        call["args"].append(d.function.arguments)
            content += choice.delta.content or ""
            finish = choice.finish_reason or finish
    message = {
        "content": content,
        "finish_reason": finish,
        "calls": [calls[i] for i in sorted(calls)],
    }
    return chunks, message


def _pairs(calls: list[Any]) -> list[tuple[str, Any]]:
    return [(c.function.name, json.loads(c.function.arguments)) for c in calls]


@pytest.mark.parametrize(
    ("script", "tool_choice", "finish_reason"),
    [(AUTO_TWO, "auto", "tool_calls"), (REQUIRED_TWO, "required", "tool_calls")],
)
def test_tool_calls_stream_incrementally_and_match_the_full_response(
    client: openai.OpenAI, script: int, tool_choice: str, finish_reason: str
) -> None:
    full = create(client, script, tool_choice=tool_choice).choices[0]
    assert full.finish_reason == finish_reason
    assert _pairs(full.message.tool_calls) == EXPECTED_TWO
    if tool_choice == "required":
        assert full.message.content is None
    _, message = streamed(client, script, tool_choice=tool_choice)
    assert message["finish_reason"] == finish_reason
    calls = message["calls"]
    assert [c["name"] for c in calls] == ["get_weather", "get_time"]
    for call, expected in zip(calls, full.message.tool_calls, strict=True):
        assert call["id"] and "".join(call["args"]) == expected.function.arguments
        assert len(call["args"]) > 1, f"arguments came in one piece: {call['args']}"
    if tool_choice == "required":
        assert message["content"] == ""  # the constrained output is the calls, not content
    else:
        assert message["content"].strip() == "Let me check."


def test_named_tool_choice_streams_arguments_and_finishes_with_stop(
    client: openai.OpenAI,
) -> None:
    full = create(client, NAMED_ONE, tool_choice=NAMED).choices[0]
    assert full.finish_reason == "stop"  # OpenAI (and vLLM) answer "stop" for a named call
    assert full.message.content is None
    assert _pairs(full.message.tool_calls) == [("get_weather", {"city": "Rome", "days": 2})]
    chunks, message = streamed(client, NAMED_ONE, tool_choice=NAMED)
    [call] = message["calls"]
    assert "".join(call["args"]) == full.message.tool_calls[0].function.arguments
    assert len(call["args"]) > 1 and message["finish_reason"] == "stop"
    assert message["content"] == ""
    # The first tool-call chunk carries id, type, name and the first arguments together.
    first = next(c for c in chunks if c.choices and c.choices[0].delta.tool_calls)
    [entry] = first.choices[0].delta.tool_calls
    assert entry.id and entry.function.name == "get_weather"


def test_auto_without_a_call_is_plain_content(client: openai.OpenAI) -> None:
    full = create(client, AUTO_TEXT, tool_choice="auto").choices[0]
    assert full.finish_reason == "stop" and full.message.tool_calls is None
    assert full.message.content == SCRIPTS[AUTO_TEXT]
    _, message = streamed(client, AUTO_TEXT)
    assert message["calls"] == [] and message["content"] == SCRIPTS[AUTO_TEXT]


@pytest.mark.parametrize("stream", [False, True])
def test_parallel_tool_calls_false_keeps_one_call(client: openai.OpenAI, stream: bool) -> None:
    if not stream:
        full = create(client, AUTO_TWO, parallel_tool_calls=False).choices[0]
        assert _pairs(full.message.tool_calls) == EXPECTED_TWO[:1]
        assert full.finish_reason == "tool_calls"
        both = create(client, AUTO_TWO, parallel_tool_calls=True).choices[0]
        assert _pairs(both.message.tool_calls) == EXPECTED_TWO
        return
    _, message = streamed(client, AUTO_TWO, parallel_tool_calls=False)
    assert [c["name"] for c in message["calls"]] == ["get_weather"]
    assert json.loads("".join(message["calls"][0]["args"])) == EXPECTED_TWO[0][1]
