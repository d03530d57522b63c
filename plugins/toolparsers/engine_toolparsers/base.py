"""Shared streaming machinery: a parser only cuts text into pieces (see ``pieces``).

``extract_tool_calls`` assembles the pieces of the whole output. Streaming re-cuts the text
generated so far on every chunk, assembles only what can no longer change and sends the
difference from what it already sent: new content characters, and each call once it is
complete, as one delta with its index, id, name and whole arguments string. So the
concatenated stream equals the non-streaming result for any split of the text.
"""

from __future__ import annotations

from abc import abstractmethod
from typing import Any

from engine_sdk.interfaces.messages import (
    DeltaMessage,
    ExtractedToolCalls,
    ToolCall,
    ToolCallDelta,
    make_tool_call_id,
)
from engine_sdk.interfaces.tool_parser import ToolParser

from engine_toolparsers.pieces import Piece, assemble


class PieceToolParser(ToolParser):
    """A ``ToolParser`` defined by :meth:`split`; one instance per request.

    ``requires_special_tokens`` (on the SDK's ``ToolParser``): set it when the markers are
    special tokens, so the server detokenizes with ``skip_special_tokens=False``.
    """

    def __init__(self, tokenizer: Any = None) -> None:
        super().__init__(tokenizer)
        self._sent_content = ""
        self._sent_call_ids: list[str] = []
        self._last_tools: list[dict[str, Any]] | None = None

    @abstractmethod
    def split(self, text: str, final: bool, tools: list[dict[str, Any]] | None) -> list[Piece]:
        """Cut ``text`` into pieces; with ``final=False`` an undecided tail is PENDING."""

    def new_call_id(self) -> str:
        """The id of a new call (formats with their own id rules override this)."""
        return make_tool_call_id()

    def extract_tool_calls(
        self, model_output: str, tools: list[dict[str, Any]] | None = None
    ) -> ExtractedToolCalls:
        content, calls = assemble(self.split(model_output, True, tools), final=True)
        tool_calls = [
            ToolCall(name=call.name, arguments=call.arguments, id=self.new_call_id())
            for call in calls
        ]
        return ExtractedToolCalls(tool_calls=tool_calls, content=content or None)

    def extract_tool_calls_streaming(
        self,
        previous_text: str,
        current_text: str,
        delta_text: str,
        tools: list[dict[str, Any]] | None = None,
    ) -> DeltaMessage | None:
        return self._advance(current_text, final=False, tools=tools)

    def finish_streaming(self, current_text: str) -> DeltaMessage | None:
        # The tools only change how values are typed, never where pieces are cut; the last
        # streaming call's tools are remembered for this flush.
        return self._advance(current_text, final=True, tools=self._last_tools)

    def _advance(
        self, text: str, final: bool, tools: list[dict[str, Any]] | None
    ) -> DeltaMessage | None:
        self._last_tools = tools
        content, calls = assemble(self.split(text, final, tools), final=final)
        delta = DeltaMessage()
        if len(content) > len(self._sent_content) and content.startswith(self._sent_content):
            delta.content = content[len(self._sent_content) :]
            self._sent_content = content
        for index in range(len(self._sent_call_ids), len(calls)):
            call_id = self.new_call_id()
            self._sent_call_ids.append(call_id)
            call = calls[index]
            delta.tool_calls.append(
                ToolCallDelta(index=index, id=call_id, name=call.name, arguments=call.arguments)
            )
        return None if delta.is_empty() else delta
