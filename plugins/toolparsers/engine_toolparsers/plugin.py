"""Entry-point module of engine-toolparsers: declares the parsers, imports none of them."""

from __future__ import annotations

from engine_sdk import ToolParserSpec, hookimpl

_PACKAGE = "engine_toolparsers"


@hookimpl
def register_tool_parsers() -> list[ToolParserSpec]:
    return [
        ToolParserSpec(
            name="hermes",
            target=f"{_PACKAGE}.hermes:HermesToolParser",
            description="JSON in <tool_call> tags (Hermes 2/3, Qwen2.5, Qwen3)",
        ),
        ToolParserSpec(
            name="llama3_json",
            target=f"{_PACKAGE}.llama3_json:Llama3JsonToolParser",
            description='Llama 3.x JSON calls {"name", "parameters"}, ";"-separated',
        ),
        ToolParserSpec(
            name="mistral",
            target=f"{_PACKAGE}.mistral:MistralToolParser",
            description="[TOOL_CALLS] JSON array or name[ARGS]{...} (Mistral, Magistral)",
        ),
        ToolParserSpec(
            name="pythonic",
            target=f"{_PACKAGE}.pythonic:PythonicToolParser",
            description="a Python list of calls [f(a=1), g()] (Llama 3.2/4 pythonic)",
        ),
        ToolParserSpec(
            name="qwen3_xml",
            target=f"{_PACKAGE}.qwen3_xml:Qwen3XmlToolParser",
            description="<function=NAME><parameter=P> XML (Qwen3-Coder), schema-typed values",
        ),
    ]
