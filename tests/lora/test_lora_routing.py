"""In-process (no sockets): the request's ``model`` reaches the engine as a
``LoRARequest`` through every route and through ``DataParallelAsyncLLM``; in-use counting
releases on every way a request ends; the registry's checks."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from engine.data_parallel import DataParallelAsyncLLM
from engine.entrypoints.openai.api_server import build_app
from engine.entrypoints.openai.metrics import ServerMetrics
from engine.entrypoints.openai.serving_base import ServingContext
from engine.lora.adapter import LoRAAdapterError
from engine.lora.registry import (
    AdapterInUseError,
    LoRAModule,
    LoRARegistry,
    UnknownAdapterError,
    parse_lora_modules,
    read_hf_config,
)
from engine.server_config import ServerArgs
from engine.testing.fake_client import FakeEngineClient, FakeEngineConfig
from fastapi.testclient import TestClient

pytestmark = pytest.mark.timeout(120)


@pytest.fixture(scope="module")
def tokenizer(tmp_path_factory: pytest.TempPathFactory) -> Any:
    from engine_sdk.testing.models import build_tiny_tokenizer

    return build_tiny_tokenizer(Path(tmp_path_factory.mktemp("tok")))


def _setup(tokenizer: Any, qwen3_lora_model: Path, adapters: dict[str, Path], dp: bool = False):
    engines = [FakeEngineClient(tokenizer, FakeEngineConfig(step_s=0.001)) for _ in range(2)]
    engine: Any = DataParallelAsyncLLM(engines) if dp else engines[0]
    registry = LoRARegistry(16, read_hf_config(str(qwen3_lora_model)), ["fake"])
    registry.add(LoRAModule("alpha", str(adapters["alpha"])))
    ctx = ServingContext(engine, ["fake"], ServerMetrics("fake", engine.stats), lora=registry)
    client = TestClient(build_app(ctx, ServerArgs(log_stats_interval=0)))
    return client, engines, registry


@pytest.mark.parametrize("dp", [False, True], ids=["one-engine", "data-parallel"])
def test_model_name_reaches_the_engine_as_a_lora_request(tokenizer, qwen3_lora_model, adapters, dp):
    client, engines, registry = _setup(tokenizer, qwen3_lora_model, adapters, dp)
    alpha = registry.get("alpha")
    bodies = {
        "/v1/completions": {"prompt": "hi", "max_tokens": 2},
        "/v1/chat/completions": {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 2},
        "/v1/responses": {"input": "hi", "max_output_tokens": 2},
    }
    for route, body in bodies.items():
        for model, want in (("alpha", alpha), ("fake", None)):
            for engine in engines:
                engine.last_lora_request = "unset"  # type: ignore[assignment]
            r = client.post(route, json={**body, "model": model})
            assert r.status_code == 200, (route, r.text)
            seen = [e.last_lora_request for e in engines if e.last_lora_request != "unset"]
            assert seen == [want], (route, model)
    assert registry._in_use == {}  # every request released its adapter
    streamed = client.post(
        "/v1/completions",
        json={"model": "alpha", "prompt": "hi", "max_tokens": 3, "stream": True},
    )
    assert streamed.status_code == 200 and "[DONE]" in streamed.text
    assert registry._in_use == {}
    assert client.post("/v1/load_lora_adapter", json={}).status_code == 404  # route is off


def test_registry_checks(qwen3_lora_model, adapters, tmp_path) -> None:
    registry = LoRARegistry(16, read_hf_config(str(qwen3_lora_model)), ["base"], str(tmp_path))
    with pytest.raises(LoRAAdapterError, match="base model's name"):
        registry.add(LoRAModule("base", str(adapters["alpha"])))
    with pytest.raises(LoRAAdapterError, match="outside --lora-root"):
        registry.add(LoRAModule("x", str(adapters["alpha"])), runtime=True)
    with pytest.raises(LoRAAdapterError, match="not a local folder"):
        registry.add(LoRAModule("x", "s3://bucket/adapter"), runtime=True)
    first = registry.add(LoRAModule("alpha", str(adapters["alpha"])))
    registry.acquire(first)
    with pytest.raises(AdapterInUseError, match="in use by 1"):
        registry.remove("alpha")
    registry.release(first)
    registry.remove("alpha")
    with pytest.raises(UnknownAdapterError):
        registry.remove("alpha")
    again = registry.add(LoRAModule("alpha", str(adapters["alpha"])))
    assert again.lora_int_id != first.lora_int_id and again.cache_key != first.cache_key


def test_parse_lora_modules() -> None:
    mods = parse_lora_modules(["a=/x", '{"name": "b", "path": "/y", "base_model_name": "m"}'])
    assert mods == [LoRAModule("a", "/x"), LoRAModule("b", "/y", "m")]
    for bad in ("a", "=/x", '{"name": "b"}', "{nope"):
        with pytest.raises(LoRAAdapterError, match="--lora-modules"):
            parse_lora_modules([bad])
