"""The tool-call parser contract.

One parser instance serves one request. ``extract_tool_calls`` parses a finished output;
``extract_tool_calls_streaming`` is called once per generated chunk with the text so far and
returns what to send (or ``None`` to hold back). For any split of the same text into chunks,
the concatenated streaming deltas must equal the non-streaming result; malformed output is
returned as plain content, never raised.

One exception, for parsers that set ``streams_partial_calls``: they stream a call's
arguments while it is generated (as OpenAI and vLLM do), so an output that ends inside an
unfinished call (cut off by ``max_tokens``) has one more, partial, call in the stream than
the non-streaming result, which keeps that text as content.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from typing import Any, ClassVar

from engine_sdk.interfaces.messages import DeltaMessage, ExtractedToolCalls


class ToolParser(ABC):
    """Parses tool calls out of model output; one instance per request."""

    #: The ``--tool-call-parser`` name (informational; the spec's ``name`` selects it).
    name: ClassVar[str] = ""
    # Arguments stream as generated (see the module docstring); False: each call whole.
    streams_partial_calls: ClassVar[bool] = False
    #: True when the markers this parser reads are special tokens: the server then
    #: detokenizes with ``skip_special_tokens=False`` so the parser sees them.
    requires_special_tokens: ClassVar[bool] = False

    def __init__(self, tokenizer: Any = None) -> None:
        self.tokenizer = tokenizer

    @abstractmethod
    def extract_tool_calls(
        self, model_output: str, tools: list[dict[str, Any]] | None = None
    ) -> ExtractedToolCalls:
        """Split a complete output into tool calls and remaining content."""

    @abstractmethod
    def extract_tool_calls_streaming(
        self,
        previous_text: str,
        current_text: str,
        delta_text: str,
        tools: list[dict[str, Any]] | None = None,
    ) -> DeltaMessage | None:
        """Return the delta to stream for ``delta_text``, or ``None`` to wait for more."""

    def finish_streaming(self, current_text: str) -> DeltaMessage | None:
        """Flush anything held back when generation ends (default: nothing)."""
        return None
