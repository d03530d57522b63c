"""A real ``engine serve --enable-lora`` driven with the openai client and httpx: adapters
by model name (tokens equal transformers + PEFT), /v1/models with parents, 404 listing the
served names, runtime load/unload (auth, --lora-root, clear 400s, 409 while in use), the
lora_requests_info gauge (engine: and vllm:), and startup errors of the flags."""

from __future__ import annotations

import json
import shutil
import subprocess
import threading
from collections.abc import Iterator
from pathlib import Path

import httpx
import openai
import pytest
from engine_sdk.testing.models import build_tiny_model
from engine_sdk.testing.server import ServerProcess, free_port
from lora_builders import CPU_SERVE_FLAGS, ENGINE, build_adapter, hf_lora_greedy
from prometheus_client.parser import text_string_to_metric_families

pytestmark = pytest.mark.timeout(300)

KEY = "lora-test-key"
PROMPT = [5, 17, 42, 99, 7, 3]
FLAGS = [*CPU_SERVE_FLAGS, "--max-num-seqs", "16", "--metrics-compat", "vllm"]


@pytest.fixture(scope="module")
def root(tmp_path_factory: pytest.TempPathFactory, qwen3_lora_model: Path) -> Path:
    """--lora-root with gamma (loaded at runtime), a rank-32 adapter, one missing its
    weights, one with an unknown target and one trained on another base model."""
    root = tmp_path_factory.mktemp("lora-root")
    build_adapter(qwen3_lora_model, root / "gamma", 16, ["o_proj", "down_proj"], seed=5)
    build_adapter(qwen3_lora_model, root / "rank32", 32, ["q_proj"], seed=6)
    shutil.copytree(root / "gamma", root / "noweights")
    (root / "noweights" / "adapter_model.safetensors").unlink()
    shutil.copytree(root / "gamma", root / "embed")
    config = json.loads((root / "embed" / "adapter_config.json").read_text())
    config["target_modules"] = ["embed_tokens", "q_proj"]
    (root / "embed" / "adapter_config.json").write_text(json.dumps(config))
    other = build_tiny_model(tmp_path_factory.mktemp("other-base"), "Qwen3ForCausalLM",
                             hidden_size=32)  # fmt: skip
    build_adapter(other, root / "other", 4, ["q_proj"], seed=7)
    return root


@pytest.fixture(scope="module")
def server(
    qwen3_lora_model: Path, adapters: dict[str, Path], root: Path
) -> Iterator[ServerProcess]:
    port = free_port()
    beta = json.dumps({"name": "beta", "path": str(adapters["beta"]), "base_model_name": "tiny"})
    cmd = [*ENGINE, "serve", str(qwen3_lora_model), "--port", str(port), *FLAGS]
    cmd += ["--enable-lora", "--max-loras", "2", "--max-cpu-loras", "3"]
    cmd += ["--lora-modules", f"alpha={adapters['alpha']}", beta]
    cmd += ["--lora-root", str(root), "--allow-runtime-lora-updating"]
    srv = ServerProcess(cmd, port, api_key=KEY, key_in_env=True).start()
    yield srv
    srv.stop()


def _client(srv: ServerProcess) -> openai.OpenAI:
    return openai.OpenAI(base_url=srv.base_url + "/v1", api_key=KEY, max_retries=0)


def _post(
    srv: ServerProcess, route: str, body: dict[str, object], key: str = KEY
) -> httpx.Response:
    headers = {"Authorization": f"Bearer {key}"}
    return httpx.post(srv.base_url + route, json=body, headers=headers, timeout=60)


def _greedy(srv: ServerProcess, model: str, max_tokens: int = 6) -> str:
    out = _client(srv).completions.create(
        model=model, prompt=PROMPT, max_tokens=max_tokens, temperature=0,
        extra_body={"ignore_eos": True},
    )  # fmt: skip
    return out.choices[0].text


def _reference(model_dir: Path, adapter: Path | None) -> str:
    from transformers import AutoTokenizer

    ids = hf_lora_greedy(model_dir, adapter, PROMPT, 6)
    return str(AutoTokenizer.from_pretrained(str(model_dir)).decode(ids, skip_special_tokens=True))


def test_models_lists_adapters_with_their_parent(server: ServerProcess, adapters) -> None:
    cards = {m.id: m.model_dump() for m in _client(server).models.list().data}
    assert list(cards)[:3] == ["tiny", "alpha", "beta"]
    assert cards["alpha"]["parent"] == "tiny" and cards["alpha"]["root"] == str(adapters["alpha"])
    assert cards["beta"]["parent"] == "tiny"
    assert cards["tiny"]["parent"] is None


def test_model_name_selects_the_adapter(server, qwen3_lora_model, adapters) -> None:
    texts = {name: _greedy(server, name) for name in ("alpha", "beta", "tiny")}
    assert texts["alpha"] == _reference(qwen3_lora_model, adapters["alpha"])
    assert texts["beta"] == _reference(qwen3_lora_model, adapters["beta"])
    assert texts["tiny"] == _reference(qwen3_lora_model, None)
    assert len(set(texts.values())) == 3


def test_unknown_model_is_404_listing_served_names(server: ServerProcess) -> None:
    with pytest.raises(openai.NotFoundError) as info:
        _client(server).completions.create(model="nope", prompt="hi", max_tokens=1)
    message = str(info.value)
    assert "nope" in message and "tiny" in message and "alpha" in message and "beta" in message


def test_runtime_load_use_and_unload(server, qwen3_lora_model, root) -> None:
    assert (
        _post(
            server,
            "/v1/load_lora_adapter",
            {"lora_name": "gamma", "lora_path": str(root / "gamma")},
            key="wrong",
        ).status_code
        == 401
    )
    r = _post(
        server, "/v1/load_lora_adapter", {"lora_name": "gamma", "lora_path": str(root / "gamma")}
    )
    assert r.status_code == 200, r.text
    assert "gamma" in [m.id for m in _client(server).models.list().data]
    assert _greedy(server, "gamma") == _reference(qwen3_lora_model, root / "gamma")
    again = _post(
        server, "/v1/load_lora_adapter", {"lora_name": "gamma", "lora_path": str(root / "gamma")}
    )
    assert again.status_code == 400 and "already loaded" in again.text
    r = _post(server, "/v1/unload_lora_adapter", {"lora_name": "gamma"})
    assert r.status_code == 200, r.text
    with pytest.raises(openai.NotFoundError):
        _greedy(server, "gamma")
    missing = _post(server, "/v1/unload_lora_adapter", {"lora_name": "gamma"})
    assert missing.status_code == 404


@pytest.mark.parametrize(
    ("folder", "words"),
    [
        ("rank32", ["rank 32", "--max-lora-rank 16"]),
        ("noweights", ["adapter_model.safetensors", "missing"]),
        ("embed", ["unknown modules", "embed_tokens"]),
        ("other", ["base-model mismatch", "in=32", "in=64"]),
        ("does-not-exist", ["not a local folder"]),
    ],
)
def test_bad_loads_are_400_naming_the_problem(server, root, folder, words) -> None:
    r = _post(
        server,
        "/v1/load_lora_adapter",
        {"lora_name": f"x-{folder}", "lora_path": str(root / folder)},
    )
    assert r.status_code == 400, r.text
    message = r.json()["error"]["message"]
    for word in words:
        assert word in message, message


def test_paths_outside_lora_root_are_refused(server, adapters) -> None:
    r = _post(
        server,
        "/v1/load_lora_adapter",
        {"lora_name": "outside", "lora_path": str(adapters["gamma"])},
    )
    assert r.status_code == 400 and "--lora-root" in r.json()["error"]["message"]


def test_unloading_an_adapter_in_use_is_refused_until_it_finishes(server, root) -> None:
    path = str(root / "gamma")
    assert (
        _post(server, "/v1/load_lora_adapter", {"lora_name": "busy", "lora_path": path}).status_code
        == 200
    )
    client = _client(server)
    stream = client.completions.create(
        model="busy", prompt=PROMPT, max_tokens=200, temperature=0, stream=True,
        extra_body={"ignore_eos": True},
    )  # fmt: skip
    first = next(iter(stream))
    assert first.choices[0].text is not None
    refused = _post(server, "/v1/unload_lora_adapter", {"lora_name": "busy"})
    assert refused.status_code == 409 and "in use" in refused.text
    rest = list(stream)
    assert rest[-1].choices[0].finish_reason == "length" if rest[-1].choices else True
    done = _post(server, "/v1/unload_lora_adapter", {"lora_name": "busy"})
    assert done.status_code == 200, done.text


def _lora_info(server: ServerProcess) -> dict[str, dict[str, str]]:
    text = httpx.get(server.base_url + "/metrics", headers={"Authorization": f"Bearer {KEY}"}).text
    out = {}
    for family in text_string_to_metric_families(text):
        if family.name.endswith("lora_requests_info"):
            (sample,) = family.samples
            out[family.name] = sample.labels
    return out


def test_lora_requests_info_gauge(server: ServerProcess) -> None:
    info = _lora_info(server)
    assert info["engine:lora_requests_info"]["max_lora"] == "2"
    assert info["vllm:lora_requests_info"] == {
        "max_lora": "2", "running_lora_adapters": "", "waiting_lora_adapters": "",
    }  # fmt: skip
    seen: list[dict[str, str]] = []
    stop = threading.Event()

    def scrape() -> None:
        while not stop.is_set():
            seen.append(_lora_info(server)["engine:lora_requests_info"])

    thread = threading.Thread(target=scrape)
    thread.start()
    try:
        _greedy(server, "alpha", max_tokens=120)
    finally:
        stop.set()
        thread.join()
    assert any(s["running_lora_adapters"] == "alpha" for s in seen), seen[-3:]


def _serve_fails(args: list[str]) -> str:
    proc = subprocess.run([*ENGINE, "serve", *args], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 2, proc.stderr
    return proc.stderr


def test_startup_errors_name_value_limit_and_flag(qwen3_lora_model, root) -> None:
    model = str(qwen3_lora_model)
    err = _serve_fails([model, "--enable-lora", "--lora-modules", f"big={root / 'rank32'}"])
    assert "rank 32" in err and "--max-lora-rank 16" in err
    err = _serve_fails([model, "--enable-lora", "--lora-modules", f"x={root / 'nope'}"])
    assert "nope" in err and "not a local folder" in err
    err = _serve_fails([model, "--enable-lora", "--lora-modules", f"o={root / 'other'}"])
    assert "base-model mismatch" in err
    err = _serve_fails([model, "--enable-lora", "--lora-modules", f"e={root / 'embed'}"])
    assert "embed_tokens" in err
    err = _serve_fails([model, "--lora-modules", f"g={root / 'gamma'}"])
    assert "--enable-lora" in err
    err = _serve_fails([model, "--enable-lora", "--max-loras", "4", "--max-cpu-loras", "2"])
    assert "--max-cpu-loras (2)" in err


def test_run_batch_serves_adapters_by_model_name(qwen3_lora_model, adapters, tmp_path) -> None:
    """``engine run-batch --enable-lora --lora-modules``: lines pick adapters by model."""
    body = {"prompt": PROMPT, "max_tokens": 6, "temperature": 0, "ignore_eos": True}
    lines = [
        {"custom_id": name, "method": "POST", "url": "/v1/completions",
         "body": {**body, "model": name}}
        for name in ("alpha", "tiny", "nope")
    ]  # fmt: skip
    src, dst = tmp_path / "in.jsonl", tmp_path / "out.jsonl"
    src.write_text("\n".join(json.dumps(line) for line in lines) + "\n")
    cmd = [*ENGINE, "run-batch", "-i", str(src), "-o", str(dst), str(qwen3_lora_model)]
    cmd += [f for f in FLAGS if f not in ("--metrics-compat", "vllm")]
    cmd += ["--enable-lora", "--lora-modules", f"alpha={adapters['alpha']}"]
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=240)
    assert done.returncode == 0, done.stderr[-3000:]
    records = {r["custom_id"]: r for r in map(json.loads, dst.read_text().splitlines())}
    text = {k: records[k]["response"]["body"]["choices"][0]["text"] for k in ("alpha", "tiny")}
    assert text["alpha"] == _reference(qwen3_lora_model, adapters["alpha"])
    assert text["tiny"] == _reference(qwen3_lora_model, None)
    assert records["nope"]["response"]["status_code"] == 404
