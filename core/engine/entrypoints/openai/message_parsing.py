"""One chat choice's output -> reasoning, content and tool calls (whole or streamed).

The reasoning parser runs first and the tool stage sees only the content after the think
section: the ``--tool-call-parser`` for ``tool_choice`` auto, ``ForcedToolCalls`` for
required / named (constrained JSON), else the content passes through. One ``ChoiceParser``
per choice, since parsers keep streaming state::

    output text ─> reasoning parser ─┬─> reasoning_content (and reasoning)
                                     └─> content ─> tool stage ─┬─> content
                                                                └─> tool_calls
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from engine_sdk.interfaces.messages import DeltaMessage, ToolCall, ToolCallDelta
from engine_sdk.interfaces.reasoning_parser import ReasoningParser
from engine_sdk.interfaces.tool_parser import ToolParser

from engine.entrypoints.openai.chat_features import ChatFeatures
from engine.entrypoints.openai.forced_tool_calls import ForcedToolCalls
from engine.entrypoints.openai.protocol import (
    DeltaFunctionCall,
    DeltaToolCall,
    FunctionCall,
    ToolCallItem,
)
from engine.entrypoints.openai.protocol import DeltaMessage as ApiDelta
from engine.entrypoints.openai.tool_choice import ToolPlan


@dataclass
class ChatPlan:
    """How a chat request's output is parsed (decided while preparing the request)."""

    tools: ToolPlan = field(default_factory=ToolPlan)
    reasoning_parser_cls: type[ReasoningParser] | None = None  # None: no think section
    tool_parser_cls: type[ToolParser] | None = None  # set for tool_choice auto

    @property
    def parses(self) -> bool:
        return self.reasoning_parser_cls is not None or self.tools.mode != "none"


def make_chat_plan(tools: ToolPlan, features: ChatFeatures, prompt_closed_think: bool) -> ChatPlan:
    """``prompt_closed_think``: the rendered prompt already ended the think section (e.g.
    ``enable_thinking=False``), so the whole output is content."""
    reasoning = None if prompt_closed_think else features.reasoning_parser_cls
    tool_parser = features.tool_parser_cls if tools.mode == "auto" else None
    return ChatPlan(tools, reasoning, tool_parser)


def needs_special_tokens(plan: ChatPlan) -> bool:
    """Whether the parsers read markers that are special tokens (keep them when decoding)."""
    return any(
        cls.requires_special_tokens
        for cls in (plan.reasoning_parser_cls, plan.tool_parser_cls)
        if cls is not None
    )


@dataclass
class ParsedMessage:
    content: str | None
    reasoning: str | None
    tool_calls: list[ToolCall]


def _merge(into: DeltaMessage, other: DeltaMessage | None) -> None:
    if other is None:
        return
    if other.content:
        into.content = (into.content or "") + other.content
    if other.reasoning_content:
        into.reasoning_content = (into.reasoning_content or "") + other.reasoning_content
    into.tool_calls.extend(other.tool_calls)


class ChoiceParser:
    """Parses one choice; ``stream`` per text delta then ``finish``, or ``parse`` once."""

    def __init__(self, plan: ChatPlan, tokenizer: Any = None) -> None:
        self.plan = plan
        cls = plan.reasoning_parser_cls
        self.reasoning: ReasoningParser | None = None if cls is None else cls(tokenizer)
        tool_cls = plan.tool_parser_cls
        self.tool: ToolParser | None = None if tool_cls is None else tool_cls(tokenizer)
        forced = plan.tools.mode in ("required", "named")
        self.forced = ForcedToolCalls(plan.tools) if forced else None
        self.tools = plan.tools.tools or None
        self._text = ""
        self._content = ""
        self.num_tool_calls = 0

    # -- whole output -------------------------------------------------------------------------

    def parse(self, text: str) -> ParsedMessage:
        reasoning: str | None = None
        content: str | None = text
        if self.reasoning is not None:
            reasoning, content = self.reasoning.extract_reasoning(text)
        calls: list[ToolCall] = []
        if self.forced is not None:
            calls, content = self.forced.parse(content or "")
        elif self.tool is not None:
            extracted = self.tool.extract_tool_calls(content or "", self.tools)
            calls, content = extracted.tool_calls, extracted.content
        if not self.plan.tools.parallel:
            calls = calls[:1]  # parallel_tool_calls: false (auto: the parser may find more)
        self.num_tool_calls = len(calls)
        if calls and self.forced is not None:
            content = None  # the constrained output is the calls, never content
        return ParsedMessage(content or None, reasoning or None, calls)

    # -- streaming ----------------------------------------------------------------------------

    def stream(self, delta_text: str) -> DeltaMessage:
        previous = self._text
        self._text += delta_text
        out = DeltaMessage()
        if self.reasoning is None:
            piece = delta_text
        else:
            step = self.reasoning.extract_reasoning_streaming(previous, self._text, delta_text)
            piece = (step.content or "") if step is not None else ""
            if step is not None and step.reasoning_content:
                out.reasoning_content = step.reasoning_content
        _merge(out, self._content_stage(piece, final=False))
        return out

    def finish(self) -> DeltaMessage:
        out = DeltaMessage()
        piece = ""
        if self.reasoning is not None:
            step = self.reasoning.finish_streaming(self._text)
            if step is not None:
                piece = step.content or ""
                out.reasoning_content = step.reasoning_content or None
        _merge(out, self._content_stage(piece, final=True))
        return out

    def _content_stage(self, piece: str, final: bool) -> DeltaMessage | None:
        previous = self._content
        self._content += piece
        if self.forced is not None:
            step = self.forced.stream(self._content, final)
        elif self.tool is not None:
            step = DeltaMessage()
            if piece:
                _merge(
                    step,
                    self.tool.extract_tool_calls_streaming(
                        previous, self._content, piece, self.tools
                    ),
                )
            if final:
                _merge(step, self.tool.finish_streaming(self._content))
        else:
            step = DeltaMessage(content=piece or None)
        if step is not None and not self.plan.tools.parallel:
            step.tool_calls = [d for d in step.tool_calls if d.index == 0]
        if step is not None:
            indexes = {d.index for d in step.tool_calls}
            self.num_tool_calls = max(self.num_tool_calls, max(indexes, default=-1) + 1)
        return step


def api_tool_calls(calls: list[ToolCall]) -> list[ToolCallItem] | None:
    if not calls:
        return None
    return [
        ToolCallItem(id=c.id, function=FunctionCall(name=c.name, arguments=c.arguments))
        for c in calls
    ]


def api_delta(delta: DeltaMessage) -> ApiDelta:
    """The OpenAI delta of a parser delta (``reasoning`` mirrors ``reasoning_content``)."""
    tool_calls = [_api_tool_delta(d) for d in coalesce_tool_deltas(delta.tool_calls)] or None
    return ApiDelta(
        content=delta.content or None,
        reasoning_content=delta.reasoning_content or None,
        reasoning=delta.reasoning_content or None,
        tool_calls=tool_calls,
    )


def coalesce_tool_deltas(deltas: list[ToolCallDelta]) -> list[ToolCallDelta]:
    """One delta per call index (in order of first appearance), as OpenAI sends them: id
    and name from the first that has them, the arguments concatenated."""
    merged: dict[int, ToolCallDelta] = {}
    for d in deltas:
        into = merged.get(d.index)
        if into is None:
            merged[d.index] = ToolCallDelta(d.index, d.id, d.name, d.arguments)
            continue
        into.id = into.id if into.id is not None else d.id
        into.name = into.name if into.name is not None else d.name
        if d.arguments is not None:
            into.arguments = (into.arguments or "") + d.arguments
    return list(merged.values())


def _api_tool_delta(delta: ToolCallDelta) -> DeltaToolCall:
    function = None
    if delta.name is not None or delta.arguments is not None:
        function = DeltaFunctionCall(name=delta.name, arguments=delta.arguments)
    return DeltaToolCall(
        index=delta.index,
        id=delta.id,
        type="function" if delta.id is not None else None,
        function=function,
    )


def tool_finish_reason(
    finish_reason: str | None, num_tool_calls: int, tool_mode: str = "auto"
) -> str | None:
    """``tool_calls`` for an output that ended normally after making calls, except for a
    named ``tool_choice``, where OpenAI (and vLLM) answer ``stop``."""
    if num_tool_calls and finish_reason == "stop" and tool_mode != "named":
        return "tool_calls"
    return finish_reason
