"""Shared streaming machinery: a parser only cuts text into pieces (see ``pieces``).

``extract_tool_calls`` assembles the pieces of the whole output. Streaming re-cuts the text
generated so far on every chunk, assembles only what can no longer change and sends the
difference from what it already sent: new content characters, and each call's id and name
then its arguments. A format that can read an unfinished call (``partial_call``: its name
and a prefix of its final arguments string) streams the arguments as they are generated;
otherwise a call is sent whole once complete. So the concatenated stream equals the
non-streaming result for any split of the text (a call cut off by ``max_tokens`` is the
exception: its streamed start cannot be taken back).
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

from engine_toolparsers.pieces import Piece, PieceKind, assemble


class PieceToolParser(ToolParser):
    """A ``ToolParser`` defined by :meth:`split`; one instance per request.

    ``requires_special_tokens`` (on the SDK's ``ToolParser``): set it when the markers are
    special tokens, so the server detokenizes with ``skip_special_tokens=False``.
    """

    def __init__(self, tokenizer: Any = None) -> None:
        super().__init__(tokenizer)
        self._sent_content = ""
        self._sent_call_ids: list[str] = []
        self._sent_arguments: list[str] = []  # per call index, what was streamed so far
        self._last_tools: list[dict[str, Any]] | None = None

    @abstractmethod
    def split(self, text: str, final: bool, tools: list[dict[str, Any]] | None) -> list[Piece]:
        """Cut ``text`` into pieces; with ``final=False`` an undecided tail is PENDING."""

    def partial_call(self, pending: str) -> tuple[str, str] | None:
        """``(name, arguments prefix)`` of the unfinished call a PENDING piece holds, once
        its name is complete; the prefix must be a prefix of the call's final ``arguments``.
        None (the default): the call is sent whole once complete."""
        return None

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
        pieces = self.split(text, final, tools)
        content, calls = assemble(pieces, final=final)
        delta = DeltaMessage()
        if len(content) > len(self._sent_content) and content.startswith(self._sent_content):
            delta.content = content[len(self._sent_content) :]
            self._sent_content = content
        for index, call in enumerate(calls):
            self._send_call(delta, index, call.name, call.arguments)
        if pieces and pieces[-1].kind is PieceKind.PENDING:
            partial = self.partial_call(pieces[-1].text)
            if partial is not None:
                self._send_call(delta, len(calls), *partial)
        return None if delta.is_empty() else delta

    def _send_call(self, delta: DeltaMessage, index: int, name: str, arguments: str) -> None:
        """Id and name of a new call, then the arguments beyond what was sent."""
        if index >= len(self._sent_call_ids):
            self._sent_call_ids.append(self.new_call_id())
            self._sent_arguments.append("")
            delta.tool_calls.append(
                ToolCallDelta(index, id=self._sent_call_ids[index], name=name, arguments="")
            )
        sent = self._sent_arguments[index]
        if len(arguments) > len(sent) and arguments.startswith(sent):
            last = delta.tool_calls[-1] if delta.tool_calls else None
            if last is not None and last.index == index:  # one delta per call and step
                last.arguments = (last.arguments or "") + arguments[len(sent) :]
            else:
                delta.tool_calls.append(ToolCallDelta(index, arguments=arguments[len(sent) :]))
            self._sent_arguments[index] = arguments
