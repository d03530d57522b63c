"""Entry-point module of engine-reasoning: declares the parsers, imports none of them."""

from __future__ import annotations

from engine_sdk import ReasoningParserSpec, hookimpl


@hookimpl
def register_reasoning_parsers() -> list[ReasoningParserSpec]:
    return [
        ReasoningParserSpec(
            name="qwen3",
            target="engine_reasoning.qwen3:Qwen3ReasoningParser",
            description="<think>...</think> that the output opens itself (Qwen3 hybrid)",
        ),
        ReasoningParserSpec(
            name="deepseek_r1",
            target="engine_reasoning.deepseek_r1:DeepSeekR1ReasoningParser",
            description="output starts inside the think section, ends at </think> (R1, QwQ)",
        ),
    ]
