"""``--metrics-compat vllm``: a real ``engine serve`` scraped as llm-d, the Gateway API
Inference Extension and KServe scrape vLLM (names, label names, values)."""

from __future__ import annotations

from collections.abc import Iterator

import httpx
import openai
import pytest

# Module level: `conftest` names this directory's conftest only while it is collected.
from conftest import REAL_SERVER_FLAGS, ServerProcess, engine_cli, free_port
from conftest import real_engine_available as available
from prometheus_client.parser import text_string_to_metric_families
from prometheus_client.samples import Sample

pytestmark = [
    pytest.mark.timeout(180),
    pytest.mark.skipif(not available(), reason="needs the real engine"),
]

# What the routers and autoscalers read (vLLM's names).
ROUTER_METRICS = [
    "vllm:num_requests_waiting", "vllm:num_requests_running", "vllm:kv_cache_usage_perc",
    "vllm:gpu_cache_usage_perc", "vllm:lora_requests_info", "vllm:prefix_cache_queries",
    "vllm:prefix_cache_hits", "vllm:cache_config_info",
]  # fmt: skip


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    from engine_sdk.testing.models import build_tiny_model

    model = build_tiny_model(tmp_path_factory.mktemp("tiny-vllm-metrics"), "Qwen3ForCausalLM")
    port = free_port()
    cmd = [*engine_cli(), "serve", str(model), "--port", str(port), *REAL_SERVER_FLAGS]
    cmd += ["--metrics-compat", "vllm", "--block-size", "16"]
    srv = ServerProcess(cmd, port).start()
    yield srv
    srv.stop()


def scrape(srv: ServerProcess) -> dict[str, list[Sample]]:
    text = httpx.get(srv.base_url + "/metrics").text
    return {f.name: f.samples for f in text_string_to_metric_families(text)}


def value(samples: list[Sample], name: str, **labels: str) -> float:
    found = [s.value for s in samples if s.name == name and labels.items() <= s.labels.items()]
    assert len(found) == 1, (name, labels, samples)
    return found[0]


def test_vllm_names_labels_and_values(server: ServerProcess) -> None:
    client = openai.OpenAI(base_url=server.base_url + "/v1", api_key="none")
    prompt = "The same prefix for both requests, long enough to fill a block or two. " * 2
    for _ in range(2):
        client.completions.create(model="tiny", prompt=prompt, max_tokens=5, temperature=0)
    families = scrape(server)
    for name in ROUTER_METRICS:
        assert name in families, f"{name} missing from /metrics"
    labels = {"model_name": "tiny", "engine": "0"}
    # every engine: family has its vllm: twin, with the same values (lora_requests_info keeps
    # vLLM's exact labels, no engine label, and the scrape time as value: checked below)
    for name, samples in families.items():
        if not name.startswith("engine:") or name == "engine:lora_requests_info":
            continue
        twin = families["vllm:" + name[len("engine:") :]]
        for sample in samples:
            if sample.name.endswith("_created"):
                continue
            vllm_name = "vllm:" + sample.name[len("engine:") :]
            vllm_labels = {
                ("finished_reason" if k == "finish_reason" else k): v
                for k, v in sample.labels.items()
            }
            assert value(twin, vllm_name, engine="0", **vllm_labels) == sample.value
    waiting = families["vllm:num_requests_waiting"]
    assert value(waiting, "vllm:num_requests_waiting", **labels) == 0
    success = families["vllm:request_success"]
    assert value(success, "vllm:request_success_total", finished_reason="length", **labels) == 2
    prompt_tokens = value(families["vllm:prompt_tokens"], "vllm:prompt_tokens_total", **labels)
    assert prompt_tokens > 0
    hits = value(families["vllm:prefix_cache_hits"], "vllm:prefix_cache_hits_total", **labels)
    assert hits >= 16  # the second request found at least one block of the first's prompt
    kv = value(families["vllm:kv_cache_usage_perc"], "vllm:kv_cache_usage_perc", **labels)
    assert kv == value(families["vllm:gpu_cache_usage_perc"], "vllm:gpu_cache_usage_perc")
    (cache_info,) = families["vllm:cache_config_info"]
    load = httpx.get(server.base_url + "/load").json()
    assert cache_info.value == 1 and cache_info.labels["block_size"] == "16"
    assert cache_info.labels["num_gpu_blocks"] == str(load["num_total_blocks"])
    assert cache_info.labels["enable_prefix_caching"] == "True"
    (lora,) = families["vllm:lora_requests_info"]
    no_adapters = {"running_lora_adapters": "", "waiting_lora_adapters": ""}
    assert lora.labels == {"max_lora": "0", **no_adapters}
    assert lora.value > 1e9  # a Unix timestamp, as vLLM sets it


def test_without_the_flag_only_engine_names() -> None:
    from engine.entrypoints.openai.metrics import ServerMetrics
    from engine.outputs import SchedulerStats

    stats = SchedulerStats(1, 2, 0.5, 0, 0, 0, 5, 10)
    metrics = ServerMetrics("m", lambda: stats)
    text = metrics.render().decode()
    assert "engine:num_requests_waiting" in text and "vllm:" not in text


def test_unknown_compat_name_is_a_usage_error() -> None:
    from engine.cli.serve_args import UsageError, parse_serve_args

    with pytest.raises(UsageError, match="--metrics-compat 'prom' is not known; use vllm"):
        parse_serve_args(["--metrics-compat", "prom"])
