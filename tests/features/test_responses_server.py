"""``/v1/responses`` through a real ``engine serve`` on a tiny random Qwen3, with the
official ``openai`` client: the same tokens as the chat route, streaming that reassembles
to the non-streamed text, ``text.format`` json_schema and a named function call that
validate (through the structured-output backend), and cancelling a running response."""

from __future__ import annotations

import json
from typing import Any

import jsonschema
import openai
import pytest
from features_server import Server

pytestmark = pytest.mark.timeout(300)

SCHEMA = {
    "type": "object",
    "properties": {"name": {"type": "string", "maxLength": 6}, "ok": {"type": "boolean"}},
    "required": ["name", "ok"],
    "additionalProperties": False,
}
WEATHER = {
    "type": "object",
    "properties": {"city": {"type": "string", "enum": ["Paris", "Rome", "Oslo"]}},
    "required": ["city"],
    "additionalProperties": False,
}


def client(server: Server) -> openai.OpenAI:
    return openai.OpenAI(base_url=server.base_url + "/v1", api_key="none", max_retries=0)


def test_same_tokens_as_chat_and_stream_reassembles(tools_server: Server) -> None:
    c = client(tools_server)
    r = c.responses.create(
        model="tiny", input="Hello", instructions="Be kind.", max_output_tokens=12,
        temperature=0,
    )  # fmt: skip
    chat = c.chat.completions.create(
        model="tiny", max_tokens=12, temperature=0,
        messages=[{"role": "system", "content": "Be kind."}, {"role": "user", "content": "Hello"}],
    )  # fmt: skip
    assert r.output_text == chat.choices[0].message.content
    assert r.usage is not None and chat.usage is not None
    assert r.usage.input_tokens == chat.usage.prompt_tokens
    assert r.usage.output_tokens == chat.usage.completion_tokens
    if chat.choices[0].finish_reason == "length":
        assert r.status == "incomplete" and r.incomplete_details is not None
        assert r.incomplete_details.reason == "max_output_tokens"
    events = list(
        c.responses.create(
            model="tiny", input="Hello", instructions="Be kind.", max_output_tokens=12,
            temperature=0, stream=True,
        )
    )  # fmt: skip
    deltas = "".join(e.delta for e in events if e.type == "response.output_text.delta")
    assert deltas == r.output_text
    assert events[0].type == "response.created" and events[-1].type in (
        "response.completed",
        "response.incomplete",
    )
    assert c.responses.retrieve(events[-1].response.id).output_text == r.output_text  # type: ignore[union-attr]


@pytest.mark.parametrize("seed", [1, 2])
def test_text_format_json_schema_streamed(tools_server: Server, seed: int) -> None:
    c = client(tools_server)
    text: Any = {"format": {"type": "json_schema", "name": "thing", "schema": SCHEMA}}
    with c.responses.stream(
        model="tiny", input="Hello", text=text, max_output_tokens=200, temperature=1.0,
        extra_body={"seed": seed},
    ) as stream:  # fmt: skip
        for _ in stream:
            pass
        final = stream.get_final_response()
    assert final.status == "completed"
    jsonschema.validate(json.loads(final.output_text), SCHEMA)


def test_named_function_call_validates(tools_server: Server) -> None:
    c = client(tools_server)
    tools: Any = [{"type": "function", "name": "get_weather", "parameters": WEATHER}]
    r = c.responses.create(
        model="tiny", input="Weather?", tools=tools, max_output_tokens=100,
        tool_choice={"type": "function", "name": "get_weather"},
    )  # fmt: skip
    calls: Any = [item for item in r.output if item.type == "function_call"]
    assert len(calls) == 1 and calls[0].name == "get_weather"
    jsonschema.validate(json.loads(calls[0].arguments), WEATHER)


def test_cancel_a_running_response(tools_server: Server) -> None:
    c = client(tools_server)
    stream = c.responses.create(
        model="tiny", input="Hello", max_output_tokens=1500, stream=True,
        extra_body={"ignore_eos": True},
    )  # fmt: skip
    response_id = ""
    types = []
    for event in stream:
        types.append(event.type)
        if event.type == "response.created":
            response_id = event.response.id
        if event.type == "response.output_text.delta" and types.count(event.type) == 1:
            got = client(tools_server).responses.cancel(response_id)
            assert got.status == "cancelled"
    assert types[-1] == "response.incomplete"
    final = c.responses.retrieve(response_id)
    assert final.status == "cancelled"
    assert final.usage is not None and 0 < final.usage.output_tokens < 1500
