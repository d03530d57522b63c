"""Entry point (group ``engine.plugins``): declares what the plugin provides.

Imported by ``engine plugins list`` and at every engine start, so it stays cheap: no torch,
no heavy imports; targets are lazy ``"module:Class"`` strings.
"""

from __future__ import annotations

from engine_sdk import ToolParserSpec, hookimpl


@hookimpl
def register_tool_parsers() -> list[ToolParserSpec]:
    return [
        ToolParserSpec(
            name="myplugin_json",
            target="engine_myplugin.tool_parser:JsonToolParser",
            description='a whole output of {"name": ..., "arguments": {...}} (or a list)',
        )
    ]
