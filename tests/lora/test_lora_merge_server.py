"""``engine serve --enable-lora --lora-merge-single-adapter`` driven with the openai client:
an adapter, the base model, an adapter loaded at runtime and the base again after its
unload all answer what transformers + PEFT answer (merged, restored, forgotten); the flag
on a quantized model is a startup error that names it."""

from __future__ import annotations

import subprocess
from collections.abc import Iterator
from pathlib import Path

import httpx
import openai
import pytest
from engine_sdk.testing.server import ServerProcess, free_port
from lora_builders import CPU_SERVE_FLAGS, ENGINE, build_adapter, hf_lora_greedy

pytestmark = pytest.mark.timeout(300)

PROMPT = [5, 17, 42, 99, 7, 3]
FLAGS = [*CPU_SERVE_FLAGS, "--enable-lora", "--max-lora-rank", "16", "--lora-merge-single-adapter"]


@pytest.fixture(scope="module")
def root(tmp_path_factory: pytest.TempPathFactory, qwen3_lora_model: Path) -> Path:
    root = tmp_path_factory.mktemp("merge-root")
    build_adapter(qwen3_lora_model, root / "delta", 8, ["q_proj", "up_proj", "down_proj"], seed=21)
    return root


@pytest.fixture(scope="module")
def server(
    qwen3_lora_model: Path, adapters: dict[str, Path], root: Path
) -> Iterator[ServerProcess]:
    port = free_port()
    cmd = [*ENGINE, "serve", str(qwen3_lora_model), "--port", str(port), *FLAGS]
    cmd += ["--lora-modules", f"alpha={adapters['alpha']}", "--lora-root", str(root)]
    cmd += ["--allow-runtime-lora-updating"]
    srv = ServerProcess(cmd, port).start()
    yield srv
    srv.stop()


def _greedy(srv: ServerProcess, model: str) -> str:
    client = openai.OpenAI(base_url=srv.base_url + "/v1", api_key="none", max_retries=0)
    out = client.completions.create(
        model=model, prompt=PROMPT, max_tokens=6, temperature=0, extra_body={"ignore_eos": True}
    )
    return out.choices[0].text


def test_adapter_base_runtime_adapter_and_base_again(server, qwen3_lora_model, adapters, root):
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(str(qwen3_lora_model))

    def want(adapter: Path | None) -> str:
        ids = hf_lora_greedy(qwen3_lora_model, adapter, PROMPT, 6)
        return str(tokenizer.decode(ids, skip_special_tokens=True))

    base = want(None)
    assert _greedy(server, "alpha") == want(adapters["alpha"]) != base
    assert _greedy(server, "tiny") == base
    body = {"lora_name": "delta", "lora_path": str(root / "delta")}
    r = httpx.post(server.base_url + "/v1/load_lora_adapter", json=body, timeout=60)
    assert r.status_code == 200, r.text
    assert _greedy(server, "delta") == want(root / "delta") != base
    r = httpx.post(server.base_url + "/v1/unload_lora_adapter", json={"lora_name": "delta"})
    assert r.status_code == 200, r.text
    assert _greedy(server, "tiny") == base
    assert _greedy(server, "alpha") == want(adapters["alpha"])
    assert "LoRA: single-adapter merging on" in server.log()


def test_without_enable_lora_is_refused_naming_both_flags(qwen3_lora_model: Path) -> None:
    args = [str(qwen3_lora_model), *[f for f in FLAGS if f != "--enable-lora"]]
    proc = subprocess.run([*ENGINE, "serve", *args], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 2, proc.stderr
    assert "--lora-merge-single-adapter needs --enable-lora" in proc.stderr


def test_quantized_model_is_refused_naming_the_flag(qwen3_lora_model: Path) -> None:
    args = [str(qwen3_lora_model), *FLAGS, "--quantization", "fp8"]
    proc = subprocess.run([*ENGINE, "serve", *args], capture_output=True, text=True, timeout=120)
    assert proc.returncode != 0 and "Traceback" not in proc.stderr, proc.stderr
    assert "--lora-merge-single-adapter needs unquantized weights" in proc.stderr
