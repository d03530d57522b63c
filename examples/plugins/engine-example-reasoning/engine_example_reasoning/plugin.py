"""Entry point of the example plugin: declares the parser; imports no torch, no engine."""

from __future__ import annotations

from engine_sdk import ReasoningParserSpec, hookimpl


@hookimpl
def register_reasoning_parsers() -> list[ReasoningParserSpec]:
    return [
        ReasoningParserSpec(
            name="tagged_reasoning",
            target="engine_example_reasoning.parser:TaggedReasoningParser",
            description="reasoning between <reasoning> and </reasoning>, answer after",
        )
    ]
