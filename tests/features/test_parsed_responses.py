"""Response shapes of reasoning and tool parsing over the real HTTP layer (in-process app)
with a scripted engine: ``reasoning_content`` + ``reasoning`` + ``content``, ``tool_calls``
with ``finish_reason`` tool_calls, streaming deltas that reassemble to the same message,
the think section skipped when the prompt closed it, and the request-level errors."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from engine.entrypoints.openai.api_server import build_app
from engine.entrypoints.openai.chat_features import ChatFeatures
from engine.entrypoints.openai.metrics import ServerMetrics
from engine.entrypoints.openai.serving_base import ServingContext
from engine.errors import StartupError
from engine.plugins import PluginManager
from engine.plugins.chat_parsers import load_tool_parser_plugin
from engine.server_config import ServerArgs
from engine.testing.fake_client import FakeEngineClient
from fastapi.testclient import TestClient

pytestmark = pytest.mark.timeout(120)

THINKING_TEMPLATE = (Path(__file__).parent / "thinking_template.jinja").read_text()
TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "get_weather",
            "parameters": {
                "type": "object",
                "properties": {"city": {"type": "string"}, "days": {"type": "integer"}},
                "required": ["city"],
            },
        },
    }
]
MESSAGES = [{"role": "user", "content": "Weather in Paris?"}]


@pytest.fixture(scope="module")
def tokenizer(tmp_path_factory: pytest.TempPathFactory) -> Any:
    from engine_sdk.testing.models import build_tiny_tokenizer

    tok = build_tiny_tokenizer(Path(tmp_path_factory.mktemp("tok")))
    tok.chat_template = THINKING_TEMPLATE
    return tok


@pytest.fixture(scope="module")
def pm() -> Any:
    return PluginManager.load()


def make_client(
    tokenizer: Any,
    script: str,
    pm: Any,
    *,
    reasoning: str | None = None,
    tool_parser: str | None = None,
    auto: bool = True,
) -> tuple[TestClient, FakeEngineClient]:
    engine = FakeEngineClient.scripted(tokenizer, script)
    features = ChatFeatures(
        tool_parser_cls=pm.registry.resolve("tool_parser", tool_parser) if tool_parser else None,
        enable_auto_tool_choice=auto and tool_parser is not None,
        reasoning_parser_cls=pm.registry.resolve("reasoning_parser", reasoning)
        if reasoning
        else None,
    )
    ctx = ServingContext(engine, ["m"], ServerMetrics("m", engine.stats), features=features)
    return TestClient(build_app(ctx, ServerArgs(log_stats_interval=0))), engine


def chat(client: TestClient, **body: Any) -> Any:
    r = client.post("/v1/chat/completions", json={"model": "m", "messages": MESSAGES, **body})
    assert r.status_code == 200, r.text
    return r.json()


def stream_chat(client: TestClient, **body: Any) -> list[dict[str, Any]]:
    body = {"model": "m", "messages": MESSAGES, "stream": True, **body}
    with client.stream("POST", "/v1/chat/completions", json=body) as r:
        assert r.status_code == 200
        lines = [line for line in r.iter_lines() if line.startswith("data: ")]
    assert lines[-1] == "data: [DONE]"
    return [json.loads(line[6:]) for line in lines[:-1]]


def reassemble(chunks: list[dict[str, Any]]) -> dict[str, Any]:
    """Concatenate streamed deltas into one message (the OpenAI client's way)."""
    message: dict[str, Any] = {"content": "", "reasoning_content": "", "reasoning": ""}
    calls: dict[int, dict[str, Any]] = {}
    finish = None
    for chunk in chunks:
        for choice in chunk["choices"]:
            delta = choice["delta"]
            for key in ("content", "reasoning_content", "reasoning"):
                message[key] += delta.get(key) or ""
            for tc in delta.get("tool_calls") or []:
                call = calls.setdefault(tc["index"], {"id": None, "name": "", "arguments": ""})
                if tc.get("id"):
                    assert call["id"] is None, "the id comes once, on the first delta"
                    assert tc["type"] == "function"
                    call["id"] = tc["id"]
                fn = tc.get("function") or {}
                call["name"] += fn.get("name") or ""
                call["arguments"] += fn.get("arguments") or ""
            finish = choice["finish_reason"] or finish
    message["tool_calls"] = [calls[i] for i in sorted(calls)]
    message["finish_reason"] = finish
    return message


def test_reasoning_split_both_fields_and_streaming(tokenizer: Any, pm: Any) -> None:
    script = "<think>\nThe user wants weather.\n</think>\n\nIt is sunny in Paris."
    client, _ = make_client(tokenizer, script, pm, reasoning="qwen3")
    msg = chat(client)["choices"][0]["message"]
    # Split as vLLM's qwen3 parser does: whitespace around the tags is kept.
    assert msg["reasoning_content"] == "\nThe user wants weather.\n"
    assert msg["reasoning"] == msg["reasoning_content"]
    assert msg["content"] == "\n\nIt is sunny in Paris."
    streamed = reassemble(stream_chat(client))
    assert streamed["reasoning_content"] == "\nThe user wants weather.\n"
    assert streamed["reasoning"] == "\nThe user wants weather.\n"
    assert streamed["content"] == "\n\nIt is sunny in Paris."
    assert streamed["finish_reason"] == "stop"


def test_no_reasoning_parser_keeps_the_text(tokenizer: Any, pm: Any) -> None:
    script = "<think>x</think>answer"
    client, _ = make_client(tokenizer, script, pm)
    msg = chat(client)["choices"][0]["message"]
    assert msg["content"] == script and msg["reasoning_content"] is None


def test_enable_thinking_false_reaches_template_and_skips_reasoning(
    tokenizer: Any, pm: Any
) -> None:
    # The prompt closes the think section, so text with a stray </think> is all content.
    script = "plain</think>answer"
    client, engine = make_client(tokenizer, script, pm, reasoning="qwen3")
    body = chat(client, chat_template_kwargs={"enable_thinking": False})
    assert engine.last_prompt is not None
    assert engine.last_prompt.endswith("<think>\n\n</think>\n\n")
    msg = body["choices"][0]["message"]
    assert msg["content"] == script and msg["reasoning_content"] is None
    body = chat(client, chat_template_kwargs={"enable_thinking": True})
    assert engine.last_prompt.endswith("<|im_start|>assistant\n")
    assert body["choices"][0]["message"]["reasoning_content"] == "plain"


def test_auto_tool_calls_after_reasoning(tokenizer: Any, pm: Any) -> None:
    call = {"name": "get_weather", "arguments": {"city": "Paris", "days": 2}}
    script = f"<think>need a tool</think>\n\n<tool_call>\n{json.dumps(call)}\n</tool_call>"
    client, engine = make_client(tokenizer, script, pm, reasoning="qwen3", tool_parser="hermes")
    body = chat(client, tools=TOOLS)  # tool_choice unset: auto on this server
    assert engine.last_prompt is not None and "get_weather" in engine.last_prompt
    choice = body["choices"][0]
    assert choice["finish_reason"] == "tool_calls"
    msg = choice["message"]
    assert msg["reasoning_content"] == "need a tool" and msg["content"] is None
    [tc] = msg["tool_calls"]
    assert tc["type"] == "function" and tc["id"].startswith("call_")
    assert tc["function"]["name"] == "get_weather"
    assert json.loads(tc["function"]["arguments"]) == call["arguments"]
    streamed = reassemble(stream_chat(client, tools=TOOLS, tool_choice="auto"))
    assert streamed["finish_reason"] == "tool_calls"
    assert streamed["reasoning_content"] == "need a tool"
    [stc] = streamed["tool_calls"]
    assert stc["name"] == "get_weather"
    assert json.loads(stc["arguments"]) == call["arguments"]


def test_tool_choice_none_gives_plain_content(tokenizer: Any, pm: Any) -> None:
    script = '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Rome"}}\n</tool_call>'
    client, engine = make_client(tokenizer, script, pm, tool_parser="hermes")
    body = chat(client, tools=TOOLS, tool_choice="none")
    assert engine.last_prompt is not None and "get_weather" in engine.last_prompt
    choice = body["choices"][0]
    assert choice["message"]["content"] == script
    assert choice["message"]["tool_calls"] is None and choice["finish_reason"] == "stop"


def test_forced_tool_choice_sets_the_constraint(tokenizer: Any, pm: Any) -> None:
    script = '[{"name": "get_weather", "parameters": {"city": "Oslo"}}]'
    client, engine = make_client(tokenizer, script, pm)  # no tool parser needed
    body = chat(client, tools=TOOLS, tool_choice="required")
    assert engine.last_params is not None and engine.last_params.structured_outputs is not None
    schema = engine.last_params.structured_outputs.json
    assert isinstance(schema, dict) and schema["type"] == "array" and schema["minItems"] == 1
    [tc] = body["choices"][0]["message"]["tool_calls"]
    assert json.loads(tc["function"]["arguments"]) == {"city": "Oslo"}
    assert body["choices"][0]["finish_reason"] == "tool_calls"
    streamed = reassemble(stream_chat(client, tools=TOOLS, tool_choice="required"))
    assert [(c["name"], json.loads(c["arguments"])) for c in streamed["tool_calls"]] == [
        ("get_weather", {"city": "Oslo"})
    ]

    client, engine = make_client(tokenizer, '{"city": "Oslo", "days": 3}', pm)
    named = {"type": "function", "function": {"name": "get_weather"}}
    body = chat(client, tools=TOOLS, tool_choice=named)
    assert engine.last_params is not None and engine.last_params.structured_outputs is not None
    assert engine.last_params.structured_outputs.json == TOOLS[0]["function"]["parameters"]
    [tc] = body["choices"][0]["message"]["tool_calls"]
    assert tc["function"]["name"] == "get_weather"
    assert json.loads(tc["function"]["arguments"]) == {"city": "Oslo", "days": 3}
    streamed = reassemble(stream_chat(client, tools=TOOLS, tool_choice=named))
    [stc] = streamed["tool_calls"]
    assert stc["arguments"] == tc["function"]["arguments"] and stc["name"] == "get_weather"
    assert streamed["finish_reason"] == "stop"  # named: "stop", as OpenAI (and vLLM)


@pytest.mark.parametrize(
    "body,status_param,needle",
    [
        ({"tool_choice": "auto", "tools": TOOLS}, "tool_choice",
         '"auto" tool choice requires --enable-auto-tool-choice and --tool-call-parser'),
        ({"tool_choice": {"type": "function", "function": {"name": "nope"}}, "tools": TOOLS},
         "tool_choice", "not in tools"),
        ({"tool_choice": "required"}, "tool_choice", "tool_choice needs tools"),
        ({"tool_choice": "required", "tools": TOOLS, "response_format": {"type": "json_object"}},
         "tool_choice", "constrains the output itself"),
        ({"guided_json": {"type": "object"}}, "guided_json",
         'guided_json was removed; use structured_outputs: {"json": ...} or response_format'),
        ({"guided_regex": "a+"}, "guided_regex", "guided_regex was removed"),
        ({"guided_choice": ["a"]}, "guided_choice", "guided_choice was removed"),
        ({"guided_grammar": "x"}, "guided_grammar", "guided_grammar was removed"),
        ({"guided_decoding_backend": "outlines"}, "guided_decoding_backend",
         "--structured-outputs-config.backend"),
        ({"guided_whitespace_pattern": " "}, "guided_whitespace_pattern", "was removed"),
        ({"structured_outputs": {"regex": "a", "choice": ["b"]}}, "structured_outputs",
         "exactly one of"),
        ({"structured_outputs": {"jsonn": {}}}, "structured_outputs", "unknown key(s) jsonn"),
        ({"response_format": {"type": "json_schema"}}, "response_format.json_schema.schema",
         "json_schema"),
        ({"response_format": {"type": "yaml"}}, "response_format.type", "not supported"),
        ({"structured_outputs": {"regex": "a"}, "response_format": {"type": "json_object"}},
         "response_format", "not both"),
    ],
)  # fmt: skip
def test_request_errors(
    tokenizer: Any, pm: Any, body: dict[str, Any], status_param: str, needle: str
) -> None:
    client, _ = make_client(tokenizer, "x", pm)  # no parser flags
    r = client.post("/v1/chat/completions", json={"model": "m", "messages": MESSAGES, **body})
    assert r.status_code == 400, r.text
    error = r.json()["error"]
    assert needle in error["message"] and error["param"] == status_param


def test_completions_refuse_guided_fields(tokenizer: Any, pm: Any) -> None:
    client, engine = make_client(tokenizer, "abc", pm)
    r = client.post("/v1/completions", json={"model": "m", "prompt": "hi", "guided_regex": "a"})
    assert r.status_code == 400 and "guided_regex was removed" in r.json()["error"]["message"]
    body = {"model": "m", "prompt": "hi", "structured_outputs": {"choice": ["abc", "d"]}}
    assert client.post("/v1/completions", json=body).status_code == 200
    assert engine.last_params is not None and engine.last_params.structured_outputs is not None
    assert engine.last_params.structured_outputs.choice == ["abc", "d"]


def test_tool_parser_plugin_file(tmp_path: Path, tokenizer: Any, pm: Any) -> None:
    plugin = tmp_path / "my_parsers.py"
    plugin.write_text(PLUGIN_SOURCE)
    names = load_tool_parser_plugin(str(plugin), pm)
    assert sorted(names) == ["call_line", "call_line_hook"]
    assert pm.get_plugin("tool-parser-plugin:my_parsers.py").provides() == {
        "tool_parser": ["call_line", "call_line_hook"]
    }
    assert pm.registry.resolve("tool_parser", "call_line_hook").__name__ == "_Hooked"
    parser = pm.registry.resolve("tool_parser", "call_line")()
    result = parser.extract_tool_calls('CALL get_weather {"city": "Rome"}')
    assert [(c.name, json.loads(c.arguments)) for c in result.tool_calls] == [
        ("get_weather", {"city": "Rome"})
    ]


def test_tool_parser_plugin_file_cannot_shadow_an_installed_parser(tmp_path: Path, pm: Any) -> None:
    plugin = tmp_path / "shadow.py"
    plugin.write_text(PLUGIN_SOURCE.replace('name = "call_line"', 'name = "hermes"'))
    with pytest.raises(StartupError) as info:
        load_tool_parser_plugin(str(plugin), pm)
    message = str(info.value)
    assert "tool_parser 'hermes' is provided twice" in message
    assert "engine-toolparsers" in message and "tool-parser-plugin:shadow.py" in message


PLUGIN_SOURCE = '''
import json
from engine_sdk import ToolParserSpec, hookimpl
from engine_sdk.interfaces.messages import DeltaMessage, ExtractedToolCalls, ToolCall
from engine_sdk.interfaces.tool_parser import ToolParser


class CallLineParser(ToolParser):
    """``CALL name {json}`` on one line is a call; anything else is content."""

    name = "call_line"

    def extract_tool_calls(self, model_output, tools=None):
        head, _, rest = model_output.partition(" ")
        if head == "CALL":
            name, _, args = rest.partition(" ")
            try:
                arguments = json.dumps(json.loads(args))
            except ValueError:
                return ExtractedToolCalls([], model_output)
            return ExtractedToolCalls([ToolCall(name, arguments)], None)
        return ExtractedToolCalls([], model_output)

    def extract_tool_calls_streaming(self, previous_text, current_text, delta_text, tools=None):
        return None


class _Hooked(CallLineParser):
    name = ""


@hookimpl
def register_tool_parsers():
    return [ToolParserSpec(name="call_line_hook", target="my_parsers:_Hooked")]
'''
