"""``/v1/responses`` item shapes and stream event order, with the official ``openai``
client over the in-process app and a scripted engine (exact reasoning, text and tool-call
output): reasoning items, messages, function calls, the typed events in order, the stored
conversation that ``previous_response_id`` continues, and the request errors."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import openai
import pytest
from engine.entrypoints.openai.api_server import build_app
from engine.entrypoints.openai.chat_features import ChatFeatures
from engine.entrypoints.openai.metrics import ServerMetrics
from engine.entrypoints.openai.serving_base import ServingContext
from engine.plugins import PluginManager
from engine.server_config import ServerArgs
from engine.testing.fake_client import FakeEngineClient
from fastapi.testclient import TestClient

pytestmark = pytest.mark.timeout(120)

THINKING_TEMPLATE = (Path(__file__).parent / "thinking_template.jinja").read_text()
WEATHER = {
    "type": "function",
    "name": "get_weather",
    "parameters": {"type": "object", "properties": {"city": {"type": "string"}}},
}
IMAGE = {"type": "input_image"}
NO_SCHEMA = {"type": "json_schema", "name": "n"}
CALL = '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Rome"}}\n</tool_call>'


@pytest.fixture(scope="module")
def tokenizer(tmp_path_factory: pytest.TempPathFactory) -> Any:
    from engine_sdk.testing.models import build_tiny_tokenizer

    tok = build_tiny_tokenizer(Path(tmp_path_factory.mktemp("tok")))
    tok.chat_template = THINKING_TEMPLATE
    return tok


@pytest.fixture(scope="module")
def pm() -> Any:
    return PluginManager.load()


def make(
    tokenizer: Any, script: str, pm: Any, *, reasoning: bool = False, tools: bool = False,
    **server: Any,
) -> tuple[openai.OpenAI, FakeEngineClient, TestClient]:  # fmt: skip
    engine = FakeEngineClient.scripted(tokenizer, script)
    features = ChatFeatures(
        tool_parser_cls=pm.registry.resolve("tool_parser", "hermes") if tools else None,
        enable_auto_tool_choice=tools,
        reasoning_parser_cls=pm.registry.resolve("reasoning_parser", "qwen3")
        if reasoning
        else None,
    )
    ctx = ServingContext(engine, ["m"], ServerMetrics("m", engine.stats), features=features)
    http = TestClient(build_app(ctx, ServerArgs(log_stats_interval=0, **server)))
    c = openai.OpenAI(base_url="http://testserver/v1", api_key="k", http_client=http, max_retries=0)
    return c, engine, http


def test_text_reasoning_and_usage(tokenizer: Any, pm: Any) -> None:
    script = "<think>\nThe user wants weather.\n</think>\n\nIt is sunny."
    c, engine, _ = make(tokenizer, script, pm, reasoning=True)
    r = c.responses.create(model="m", input="Weather?", instructions="Be brief.")
    assert [item.type for item in r.output] == ["reasoning", "message"]
    reasoning: Any = r.output[0]
    assert reasoning.content[0].text.strip() == "The user wants weather."
    # The text after </think> as vLLM's qwen3 reasoning parser splits it: newlines kept.
    assert r.output_text == "\n\nIt is sunny."
    assert r.status == "completed" and r.instructions == "Be brief."
    assert engine.last_prompt is not None
    assert engine.last_prompt.startswith("<|im_start|>system\nBe brief.<|im_end|>")
    assert "<|im_start|>user\nWeather?<|im_end|>" in engine.last_prompt
    assert r.usage is not None and r.usage.output_tokens_details.reasoning_tokens > 0
    assert r.usage.total_tokens == r.usage.input_tokens + r.usage.output_tokens


def test_stream_events_in_documented_order(tokenizer: Any, pm: Any) -> None:
    script = "<think>plan</think>Hello there, friend."
    c, _, _ = make(tokenizer, script, pm, reasoning=True)
    with c.responses.stream(model="m", input="Hi") as stream:
        types = [event.type for event in stream]
        final = stream.get_final_response()
    assert types[:2] == ["response.created", "response.in_progress"]
    assert types[-1] == "response.completed"
    reasoning_end = types.index("response.output_item.done")
    assert types[2:4] == ["response.output_item.added", "response.content_part.added"]
    assert set(types[4 : reasoning_end - 2]) == {"response.reasoning_text.delta"}
    assert types[reasoning_end - 2 : reasoning_end] == [
        "response.reasoning_text.done",
        "response.content_part.done",
    ]
    rest = types[reasoning_end + 1 : -1]
    assert rest[:2] == ["response.output_item.added", "response.content_part.added"]
    assert set(rest[2:-3]) == {"response.output_text.delta"} and len(rest[2:-3]) > 1
    assert rest[-3:] == [
        "response.output_text.done",
        "response.content_part.done",
        "response.output_item.done",
    ]
    assert final.output_text == "Hello there, friend."
    assert [item.type for item in final.output] == ["reasoning", "message"]


def test_stream_sequence_numbers_and_no_done_line(tokenizer: Any, pm: Any) -> None:
    c, _, http = make(tokenizer, "abc def", pm)
    with http.stream("POST", "/v1/responses", json={"input": "x", "stream": True}) as r:
        body = "".join(r.iter_text())
    assert "[DONE]" not in body
    blocks = [b for b in body.split("\n\n") if b]
    events = [json.loads(b.split("data: ", 1)[1]) for b in blocks]
    assert [e["sequence_number"] for e in events] == list(range(len(events)))
    for block, event in zip(blocks, events, strict=True):
        assert block.startswith(f"event: {event['type']}\n")


def test_function_call_auto_and_tool_output_round_trip(tokenizer: Any, pm: Any) -> None:
    c, engine, _ = make(tokenizer, CALL, pm, tools=True)
    tools: Any = [WEATHER]
    r = c.responses.create(model="m", input="Weather in Rome?", tools=tools)
    assert [item.type for item in r.output] == ["function_call"]
    call: Any = r.output[0]
    assert call.name == "get_weather" and json.loads(call.arguments) == {"city": "Rome"}
    assert call.call_id and r.status == "completed"
    # Send the call's output back through previous_response_id: the prompt holds the
    # earlier turn, the assistant's call and the tool's answer.
    engine.script = "It is 21 C in Rome."
    r2 = c.responses.create(
        model="m", tools=tools, previous_response_id=r.id,
        input=[{"type": "function_call_output", "call_id": call.call_id, "output": "21 C"}],
    )  # fmt: skip
    assert r2.output_text == "It is 21 C in Rome."
    prompt = engine.last_prompt or ""
    assert "Weather in Rome?" in prompt and "21 C" in prompt
    assert prompt.index("Weather in Rome?") < prompt.index("21 C")


def test_function_call_streamed(tokenizer: Any, pm: Any) -> None:
    c, _, _ = make(tokenizer, CALL, pm, tools=True)
    tools: Any = [WEATHER]
    with c.responses.stream(model="m", input="Rome?", tools=tools) as stream:
        events = list(stream)
        final = stream.get_final_response()
    types = [e.type for e in events]
    assert "response.function_call_arguments.delta" in types
    assert types.index("response.function_call_arguments.done") < types.index(
        "response.output_item.done"
    )
    call: Any = final.output[0]
    assert call.type == "function_call" and json.loads(call.arguments) == {"city": "Rome"}


def test_store_retrieve_and_previous_response(tokenizer: Any, pm: Any) -> None:
    c, engine, _ = make(tokenizer, "First answer.", pm)
    r = c.responses.create(model="m", input="one")
    got = c.responses.retrieve(r.id)
    assert got.id == r.id and got.output_text == "First answer." and got.status == "completed"
    engine.script = "Second."
    c.responses.create(model="m", input="two", previous_response_id=r.id)
    prompt = engine.last_prompt or ""
    assert prompt.index("one") < prompt.index("First answer.") < prompt.index("two")
    unstored = c.responses.create(model="m", input="three", store=False)
    with pytest.raises(openai.NotFoundError):
        c.responses.retrieve(unstored.id)


def test_store_is_bounded(tokenizer: Any, pm: Any) -> None:
    c, _, _ = make(tokenizer, "ok", pm, responses_store_size=2)
    ids = [c.responses.create(model="m", input=str(i)).id for i in range(3)]
    with pytest.raises(openai.NotFoundError, match="last 2 stored responses"):
        c.responses.retrieve(ids[0])
    assert c.responses.retrieve(ids[2]).id == ids[2]
    with pytest.raises(openai.BadRequestError) as exc:
        c.responses.create(model="m", input="x", previous_response_id=ids[0])
    assert exc.value.body["param"] == "previous_response_id"  # type: ignore[index]


def test_cancel_a_finished_response_is_400(tokenizer: Any, pm: Any) -> None:
    c, _, _ = make(tokenizer, "ok", pm)
    r = c.responses.create(model="m", input="x")
    with pytest.raises(openai.BadRequestError, match="only a response still in progress"):
        c.responses.cancel(r.id)
    with pytest.raises(openai.NotFoundError):
        c.responses.cancel("resp_missing")


@pytest.mark.parametrize(
    ("body", "param"),
    [
        ({"input": "x", "tools": [{"type": "web_search"}]}, "tools[0]"),
        ({"input": "x", "background": True}, "background"),
        ({"input": [{"type": "message", "role": "robot", "content": "x"}]}, "input[0].role"),
        ({"input": [{"role": "user", "content": [IMAGE]}]}, "input[0].content[0]"),
        ({"input": "x", "text": {"format": NO_SCHEMA}}, "text.format.schema"),
        ({"input": "x", "tool_choice": {"type": "file_search"}}, "tool_choice"),
        ({"input": "x", "max_output_tokens": 0}, "max_output_tokens"),
        ({"input": ""}, "input"),
    ],
)  # fmt: skip
def test_bad_requests_are_400_in_the_error_shape(
    tokenizer: Any, pm: Any, body: dict[str, Any], param: str
) -> None:
    _, _, http = make(tokenizer, "ok", pm)
    r = http.post("/v1/responses", json={"model": "m", **body})
    assert r.status_code == 400, r.text
    error = r.json()["error"]
    assert error["param"] == param and error["type"] == "invalid_request_error"
    assert error["message"]


def test_api_key_covers_the_responses_and_embeddings_routes(tokenizer: Any, pm: Any) -> None:
    _, _, http = make(tokenizer, "ok", pm, api_key="sekret")
    for method, path in (
        ("POST", "/v1/responses"),
        ("GET", "/v1/responses/resp_x"),
        ("POST", "/v1/responses/resp_x/cancel"),
        ("POST", "/v1/embeddings"),
    ):
        r = http.request(method, path, json={"input": "x"})
        assert r.status_code == 401, (path, r.text)
    ok = http.post("/v1/responses", json={"input": "x"}, headers={"Authorization": "Bearer sekret"})
    assert ok.status_code == 200


def test_metrics_count_responses(tokenizer: Any, pm: Any) -> None:
    c, _, http = make(tokenizer, "ok", pm)
    c.responses.create(model="m", input="x")
    c.responses.create(model="m", input="y")
    text = http.get("/metrics").text
    assert 'engine:api_requests_total{kind="responses",model_name="m"} 2.0' in text
    assert http.get("/load").json()["num_requests_in_flight_by_kind"] == {}


def test_chat_checks_apply_under_responses_names(tokenizer: Any, pm: Any) -> None:
    _, _, http = make(tokenizer, "ok", pm)
    r = http.post("/v1/responses", json={"input": "x", "max_output_tokens": 10**9})
    assert r.status_code == 400 and r.json()["error"]["param"] == "max_output_tokens"
    assert "max_output_tokens" in r.json()["error"]["message"]
    kwargs = {"input": "x", "chat_template_kwargs": {"messages": []}}  # reserved by the server
    r = http.post("/v1/responses", json=kwargs)
    assert r.status_code == 400 and r.json()["error"]["param"] == "chat_template_kwargs"
