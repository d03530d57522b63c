"""``engine chat`` / ``engine complete`` and examples/summarizer_client.py against the server."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import API_KEY, ServerProcess, engine_cli

pytestmark = pytest.mark.timeout(120)
REPO = Path(__file__).resolve().parents[2]


def run(
    cmd: list[str], env: dict[str, str] | None = None, stdin: str | None = None
) -> subprocess.CompletedProcess[str]:
    full_env = {
        k: v for k, v in os.environ.items() if k not in ("OPENAI_API_KEY", "ENGINE_API_KEY")
    }
    full_env.update(env or {})
    return subprocess.run(
        cmd, capture_output=True, text=True, env=full_env, input=stdin, timeout=90
    )


def test_chat_quick(server: ServerProcess) -> None:
    url = server.base_url + "/v1"
    res = run(
        [*engine_cli(), "chat", "--url", url, "--quick", "Hello", "--max-tokens", "5",
         "--system", "Be brief."],
        env={"ENGINE_API_KEY": API_KEY},
    )  # fmt: skip
    assert res.returncode == 0, res.stderr
    assert res.stdout.strip() != ""


def test_chat_repl_keeps_history(server: ServerProcess) -> None:
    url = server.base_url + "/v1"
    res = run(
        [*engine_cli(), "chat", "--url", url, "--api-key", API_KEY, "--max-tokens", "3"],
        stdin="Hello\nHow are you?\n/exit\n",
    )
    assert res.returncode == 0, res.stderr
    assert "Chatting with tiny" in res.stdout
    assert res.stdout.count("> ") >= 3


def test_complete_quick_with_openai_key_env(server: ServerProcess) -> None:
    res = run(
        [*engine_cli(), "complete", "--url", server.base_url + "/v1", "--quick", "Once upon",
         "--max-tokens", "4", "--model", "tiny-alias"],
        env={"OPENAI_API_KEY": API_KEY, "ENGINE_API_KEY": ""},
    )  # fmt: skip
    assert res.returncode == 0, res.stderr
    assert res.stdout.strip() != ""


def test_chat_errors_are_readable(server: ServerProcess) -> None:
    res = run(
        [*engine_cli(), "chat", "--url", server.base_url + "/v1", "--quick", "hi"],
        env={"ENGINE_API_KEY": "wrong"},
    )
    assert res.returncode == 1 and "API key" in res.stderr
    res = run([*engine_cli(), "chat", "--url", "http://127.0.0.1:9/v1", "--quick", "hi"])
    assert res.returncode == 1 and "cannot reach a server" in res.stderr


def test_summarizer_example(server: ServerProcess, tmp_path: Path) -> None:
    text = tmp_path / "notes.txt"
    text.write_text("The quick brown fox jumps over the lazy dog. " * 5)
    script = str(REPO / "examples" / "summarizer_client.py")
    base = ["--base-url", server.base_url + "/v1", "--api-key", API_KEY, "--max-tokens", "8"]
    res = run([sys.executable, script, str(text), *base])
    assert res.returncode == 0, res.stderr
    assert res.stdout.strip() != ""
    res = run([sys.executable, script, "-", *base], stdin="Paris is the capital of France.")
    assert res.returncode == 0, res.stderr
    empty = run([sys.executable, script, "-", *base], stdin="")
    assert empty.returncode != 0 and "empty" in empty.stderr
