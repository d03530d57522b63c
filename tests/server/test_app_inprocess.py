"""The app in-process (no sockets) over the stand-in engine: validation messages, per-app
metric registries, request ids, warnings once."""

from __future__ import annotations

import json
import logging
from pathlib import Path
from typing import Any

import pytest
from engine.entrypoints.openai.api_server import build_app
from engine.entrypoints.openai.metrics import ServerMetrics
from engine.entrypoints.openai.serving_base import ServingContext
from engine.server_config import ServerArgs
from engine.testing.fake_client import FakeEngineClient, FakeEngineConfig
from fastapi.testclient import TestClient

pytestmark = pytest.mark.timeout(60)


@pytest.fixture(scope="module")
def tokenizer(tmp_path_factory: pytest.TempPathFactory) -> Any:
    from engine_sdk.testing.models import build_tiny_tokenizer

    return build_tiny_tokenizer(Path(tmp_path_factory.mktemp("tok")))


def make_client(tokenizer: Any, **server: Any) -> TestClient:
    engine = FakeEngineClient(tokenizer, FakeEngineConfig(step_s=0.001))
    ctx = ServingContext(engine, ["fake"], ServerMetrics("fake", engine.stats))
    return TestClient(build_app(ctx, ServerArgs(log_stats_interval=0, **server)))


@pytest.mark.parametrize(
    "body,content_type,needle,param",
    [
        ("null", "application/json", "must be a JSON object", "body"),
        ('{"model": "fake", "prompt": "hi"}', "text/plain", "must be a JSON object", "body"),
        ('{"model": "fake", "messages": [{"content": "x"}]}', "application/json",
         "messages[0].role", "messages[0].role"),
        ('{"model": "fake", "prompt": "hi", "stream_options": 5}', "application/json",
         "stream_options", "stream_options"),
        ('{"model": "fake", "prompt": "hi", "max_tokens": 1.5}', "application/json",
         "max_tokens", "max_tokens"),
    ],
)  # fmt: skip
def test_validation_messages(
    tokenizer: Any, body: str, content_type: str, needle: str, param: str
) -> None:
    client = make_client(tokenizer)
    path = "/v1/chat/completions" if "messages" in body else "/v1/completions"
    r = client.post(path, content=body, headers={"content-type": content_type})
    assert r.status_code == 400
    err = r.json()["error"]
    assert needle in err["message"] and err["param"] == param


def test_image_parts_rejected_by_name(tokenizer: Any) -> None:
    client = make_client(tokenizer)
    content = [{"type": "text", "text": "hi"}, {"type": "image_url", "image_url": {"url": "x"}}]
    body = {"model": "fake", "messages": [{"role": "user", "content": content}]}
    r = client.post("/v1/chat/completions", json=body)
    assert r.status_code == 400 and "messages[0].content[1]" in r.json()["error"]["message"]
    body["messages"][0]["content"] = content[:1]
    assert client.post("/v1/chat/completions", json={**body, "max_tokens": 2}).status_code == 200


def test_two_apps_have_separate_registries(tokenizer: Any) -> None:
    a, b = make_client(tokenizer), make_client(tokenizer)
    body = {"model": "fake", "prompt": "hi", "max_tokens": 3}
    assert a.post("/v1/completions", json=body).status_code == 200
    name = "engine:generation_tokens_total"
    line_a = [x for x in a.get("/metrics").text.splitlines() if x.startswith(name)]
    line_b = [x for x in b.get("/metrics").text.splitlines() if x.startswith(name)]
    assert line_a == ['engine:generation_tokens_total{model_name="fake"} 3.0']
    assert line_b == ['engine:generation_tokens_total{model_name="fake"} 0.0']


def test_bad_request_id_header_replaced(tokenizer: Any) -> None:
    client = make_client(tokenizer)
    r = client.get("/v1/models", headers={"X-Request-Id": "bad id\twith spaces"})
    assert (
        r.headers["x-request-id"] != "bad id\twith spaces" and len(r.headers["x-request-id"]) == 32
    )


def test_unknown_fields_warned_once(tokenizer: Any, caplog: pytest.LogCaptureFixture) -> None:
    client = make_client(tokenizer)
    body = {"model": "fake", "prompt": "hi", "max_tokens": 2, "some_future_field": {"1": 5}}
    with caplog.at_level(logging.WARNING, logger="engine.server"):
        for _ in range(3):
            assert client.post("/v1/completions", json=body).status_code == 200
    warnings = [r for r in caplog.records if "some_future_field" in r.getMessage()]
    assert len(warnings) == 1


def test_docs_hidden_with_api_key(tokenizer: Any) -> None:
    assert make_client(tokenizer).get("/openapi.json").status_code == 200
    keyed = make_client(tokenizer, api_key="k")
    assert keyed.get("/openapi.json").status_code in (401, 404)
    assert keyed.get("/docs").status_code in (401, 404)


@pytest.mark.parametrize(
    "path,body,param,code",
    [
        ("/v1/completions", {"prompt": [5] * 250, "max_tokens": 10}, "max_tokens",
         "context_length_exceeded"),
        ("/v1/completions", {"prompt": [[5, 6], [5] * 256]}, "messages", "context_length_exceeded"),
        ("/v1/completions", {"prompt": "hi", "min_tokens": 9, "max_tokens": 2}, "min_tokens", 400),
        ("/v1/chat/completions", {"messages": [{"role": "user", "content": "hi " * 300}]},
         "messages", "context_length_exceeded"),
    ],
)  # fmt: skip
def test_front_end_errors_name_the_field_and_queue_nothing(
    tokenizer: Any, path: str, body: dict[str, Any], param: str, code: str | int
) -> None:
    """The engine's front end checks each prompt once (in the prepare pool); its errors are
    400s naming the request's field, and no prompt of a bad batch reaches the engine."""
    client = make_client(tokenizer)
    r = client.post(path, json={"model": "fake", **body})
    assert r.status_code == 400, r.text
    err = r.json()["error"]
    assert (err["param"], err["code"]) == (param, code)
    assert client.app.state.ctx.engine.counters().num_requests_added == 0  # type: ignore[attr-defined]


def test_batch_times_n_streams_echo_then_samples_by_choice_index(tokenizer: Any) -> None:
    client = make_client(tokenizer)
    prompts = ["hello there", "the sky"]
    body = {"model": "fake", "n": 2, "seed": 4, "max_tokens": 3, "echo": True}
    batch = client.post("/v1/completions", json={**body, "prompt": prompts}).json()
    alone = [client.post("/v1/completions", json={**body, "prompt": p}).json() for p in prompts]
    texts = {c["index"]: c["text"] for c in batch["choices"]}
    assert texts == {
        p * 2 + c["index"]: c["text"] for p, a in enumerate(alone) for c in a["choices"]
    }
    assert texts[0] != texts[1] and texts[2].startswith("the sky")
    r = client.post("/v1/completions", json={**body, "prompt": prompts, "stream": True})
    chunks = [json.loads(e[6:]) for e in r.text.split("\n\n") if e.startswith("data: {")]
    echoed = [(c["choices"][0]["index"], c["choices"][0]["text"]) for c in chunks[:4]]
    assert echoed == [(0, prompts[0]), (1, prompts[0]), (2, prompts[1]), (3, prompts[1])]
    streamed = {i: "" for i in range(4)}
    for chunk in chunks:
        streamed[chunk["choices"][0]["index"]] += chunk["choices"][0]["text"]
    assert streamed == texts
