"""Which tool-call and reasoning parsers the server uses, resolved once at startup.

The classes come from the plugin layer (:func:`engine.plugins.chat_parsers.
resolve_chat_parsers`: ``--tool-call-parser``, ``--tool-parser-plugin``,
``--reasoning-parser``); this module checks the API's own flag (``--enable-auto-tool-choice``
needs a tool parser) and holds what the serving code reads. Misconfiguration refuses to
start, naming the flag and what is installed.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from engine_sdk.interfaces.reasoning_parser import ReasoningParser
from engine_sdk.interfaces.tool_parser import ToolParser

from engine.errors import StartupError

AUTO_TOOL_CHOICE_HINT = (
    '"auto" tool choice requires --enable-auto-tool-choice and --tool-call-parser to be set '
    'on the server; send tool_choice "required", a named function or "none" instead'
)


@dataclass
class ChatFeatures:
    """The server's parsers; the default (no flags) parses nothing."""

    tool_parser_cls: type[ToolParser] | None = None
    enable_auto_tool_choice: bool = False
    reasoning_parser_cls: type[ReasoningParser] | None = None

    @property
    def auto_tool_choice(self) -> bool:
        return self.enable_auto_tool_choice and self.tool_parser_cls is not None


def load_chat_features(engine_args: Any, server_args: Any) -> ChatFeatures:
    """Resolve the parser flags; ``StartupError`` naming the flag when one is wrong."""
    from engine.plugins.chat_parsers import resolve_chat_parsers

    if server_args.enable_auto_tool_choice and not server_args.tool_call_parser:
        raise StartupError(
            "--enable-auto-tool-choice requires --tool-call-parser NAME (the format the "
            "model writes tool calls in, e.g. hermes for Qwen)"
        )
    parsers = resolve_chat_parsers(
        engine_args.plugins,
        server_args.tool_call_parser,
        engine_args.reasoning_parser,
        server_args.tool_parser_plugin,
    )
    return ChatFeatures(
        parsers.tool_parser_cls,
        bool(server_args.enable_auto_tool_choice),
        parsers.reasoning_parser_cls,
    )
