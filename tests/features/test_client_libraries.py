"""Smoke tests of the client libraries users point at Engine: LangChain's ``ChatOpenAI``
and LiteLLM's ``hosted_vllm/`` provider, against ``engine serve`` on the tiny random model
(plain chat, streaming) and over the scripted engine (tool calls), so a wire change that
breaks them fails here."""

from __future__ import annotations

import json
import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from features_server import Server, start_scripted_server

pytestmark = pytest.mark.timeout(300)

CALL = {"name": "get_weather", "arguments": {"city": "Paris"}}
SCRIPTS = [f"<tool_call>\n{json.dumps(CALL)}\n</tool_call>", "Hello from the script."]
WEATHER_TOOL: Any = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "Weather in a city",
        "parameters": {
            "type": "object",
            "properties": {"city": {"type": "string"}},
            "required": ["city"],
        },
    },
}


@pytest.fixture(scope="module")
def scripted(tiny_model: Path) -> Iterator[Server]:
    s = start_scripted_server(
        tiny_model, SCRIPTS, "--enable-auto-tool-choice", "--tool-call-parser", "hermes"
    )
    yield s
    s.stop()


def test_langchain_chat_openai(plain_server: Server, tiny_model: Path) -> None:
    langchain_openai = pytest.importorskip("langchain_openai")
    llm = langchain_openai.ChatOpenAI(
        base_url=plain_server.base_url + "/v1", api_key="none", model=tiny_model.name,
        max_tokens=5, temperature=0, max_retries=0,
    )  # fmt: skip
    message = llm.invoke("Hello")
    assert isinstance(message.content, str)
    assert message.response_metadata["finish_reason"] in ("stop", "length")
    pieces = list(llm.stream("Hello"))
    assert pieces and "".join(str(p.content) for p in pieces) == message.content


def test_langchain_tool_calls(scripted: Server) -> None:
    langchain_openai = pytest.importorskip("langchain_openai")
    llm = langchain_openai.ChatOpenAI(
        base_url=scripted.base_url + "/v1", api_key="none", model="tiny", seed=0, max_retries=0
    )
    with_tools = llm.bind_tools([WEATHER_TOOL])
    message = with_tools.invoke("Weather in Paris?")
    assert [(c["name"], c["args"]) for c in message.tool_calls] == [
        ("get_weather", {"city": "Paris"})
    ]
    chunks = list(with_tools.stream("Weather in Paris?"))
    merged = chunks[0]
    for chunk in chunks[1:]:
        merged = merged + chunk
    assert [(c["name"], c["args"]) for c in merged.tool_calls] == [
        ("get_weather", {"city": "Paris"})
    ]


def _litellm() -> Any:
    os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")  # no network at import
    return pytest.importorskip("litellm")


def test_litellm_hosted_vllm(plain_server: Server, tiny_model: Path) -> None:
    litellm = _litellm()
    args: Any = {
        "model": f"hosted_vllm/{tiny_model.name}",
        "api_base": plain_server.base_url + "/v1",
        "api_key": "none",
        "messages": [{"role": "user", "content": "Hello"}],
        "max_tokens": 5,
        "temperature": 0,
    }
    r = litellm.completion(**args)
    text = r.choices[0].message.content
    assert isinstance(text, str) and r.choices[0].finish_reason in ("stop", "length")
    streamed = "".join(
        chunk.choices[0].delta.content or "" for chunk in litellm.completion(**args, stream=True)
    )
    assert streamed == text


def test_litellm_tool_calls(scripted: Server) -> None:
    litellm = _litellm()
    r = litellm.completion(
        model="hosted_vllm/tiny", api_base=scripted.base_url + "/v1", api_key="none",
        messages=[{"role": "user", "content": "Weather in Paris?"}], tools=[WEATHER_TOOL],
        seed=0,
    )  # fmt: skip
    [call] = r.choices[0].message.tool_calls
    assert call.function.name == "get_weather"
    assert json.loads(call.function.arguments) == {"city": "Paris"}
    assert r.choices[0].finish_reason == "tool_calls"
