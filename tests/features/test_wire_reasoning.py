"""Reasoning on the wire through ``engine serve`` (scripted engine) and the ``openai``
client: qwen3 and deepseek_r1 split as vLLM's parsers of the same names for every
combination of think tags, streaming and not; every generated piece streams at once;
both ``reasoning`` and ``reasoning_content`` carry the think text."""

from __future__ import annotations

import math
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import openai
import pytest
from features_server import HERE, Server, start_scripted_server

pytestmark = pytest.mark.timeout(300)

MESSAGES: list[Any] = [{"role": "user", "content": "What is 2+2?"}]
CALL = "<tool_call>\n<function=f>\n</function>\n</tool_call>"
PLAIN = "Plain words, generated a few characters at a time, no tags."
SCRIPTS = [
    "<think>\nA.\n</think>\n\nB.",
    "A.</think>B.",
    "  <think>A. cut off",
    PLAIN,
    "</think>B.",
    "A.\n" + CALL,
    "<think>A.</think>",
]
# (reasoning, content) per script, as vLLM's parsers split them.
BOTH = [("\nA.\n", "\n\nB."), ("A.", "B."), ("A. cut off", None), (PLAIN, None), (None, "B.")]
EXPECTED = {
    "qwen3": [*BOTH, ("A.\n", CALL), ("A.", None)],
    "deepseek_r1": [*BOTH, ("A.\n" + CALL, None), ("A.", None)],
}


@pytest.fixture(scope="module", params=["qwen3", "deepseek_r1"])
def server(request: pytest.FixtureRequest, tiny_model: Path) -> Iterator[tuple[str, Server]]:
    template = str(HERE / "thinking_template.jinja")
    s = start_scripted_server(
        tiny_model, SCRIPTS, "--reasoning-parser", request.param, "--chat-template", template
    )
    yield request.param, s
    s.stop()


def _client(server: Server) -> openai.OpenAI:
    return openai.OpenAI(base_url=server.base_url + "/v1", api_key="none", max_retries=0)


def _stream(server: Server, seed: int) -> tuple[list[Any], dict[str, str]]:
    chunks = list(
        _client(server).chat.completions.create(
            model="tiny", messages=MESSAGES, seed=seed, stream=True
        )
    )
    joined = {"reasoning_content": "", "reasoning": "", "content": ""}
    for chunk in chunks:
        for choice in chunk.choices:
            extra = choice.delta.model_extra or {}
            assert extra.get("reasoning") == extra.get("reasoning_content")
            joined["reasoning_content"] += extra.get("reasoning_content") or ""
            joined["reasoning"] += extra.get("reasoning") or ""
            joined["content"] += choice.delta.content or ""
    return chunks, joined


@pytest.mark.parametrize("seed", range(len(SCRIPTS)))
def test_split_matches_vllm_streaming_and_not(server: tuple[str, Server], seed: int) -> None:
    name, s = server
    reasoning, content = EXPECTED[name][seed]
    r = _client(s).chat.completions.create(model="tiny", messages=MESSAGES, seed=seed)
    message = r.choices[0].message
    extra = message.model_extra or {}
    assert (extra.get("reasoning_content"), message.content) == (reasoning, content)
    assert extra.get("reasoning") == reasoning  # both names on the wire
    _, joined = _stream(s, seed)
    assert joined == {
        "reasoning_content": reasoning or "",
        "reasoning": reasoning or "",
        "content": content or "",
    }


def test_untagged_output_streams_every_piece_as_generated(server: tuple[str, Server]) -> None:
    _, s = server
    chunks, joined = _stream(s, SCRIPTS.index(PLAIN))
    assert joined["reasoning_content"] == PLAIN
    # The scripted engine generates 3 characters a step: one chunk each, none held back,
    # no empty chunks (one role chunk first, the finish_reason on the last piece).
    pieces = [c for c in chunks if c.choices and (c.choices[0].delta.model_extra or {}).get(
        "reasoning_content")]  # fmt: skip
    assert len(pieces) == math.ceil(len(PLAIN) / 3)
    assert len(chunks) == 1 + len(pieces)
