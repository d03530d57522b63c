"""The qwen3_xml parser on Qwen3-Coder XML tool calls, typed by the request's tool schema."""

from __future__ import annotations

from engine_sdk.testing.parsers import ToolParserConformance, ToolTranscript
from engine_toolparsers.qwen3_xml import Qwen3XmlToolParser, convert_value

TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "write_file",
            "parameters": {
                "type": "object",
                "properties": {
                    "path": {"type": "string"},
                    "content": {"type": "string"},
                    "mode": {"type": "integer"},
                    "ratio": {"type": "number"},
                    "overwrite": {"type": "boolean"},
                    "meta": {"type": "object"},
                    "tags": {"type": "array"},
                    "note": {"type": ["string", "null"]},
                },
            },
        },
    },
    {"type": "function", "function": {"name": "list_dir", "parameters": {"properties": {}}}},
]

WRITE = (
    "<tool_call>\n<function=write_file>\n<parameter=path>\n/tmp/ä.txt\n</parameter>\n"
    "<parameter=content>\ndef f():\n    return 1\n\n</parameter>\n"
    "<parameter=mode>\n644\n</parameter>\n<parameter=ratio>\n0.25\n</parameter>\n"
    "<parameter=overwrite>\nTrue\n</parameter>\n"
    '<parameter=meta>\n{"owner": "José", "size": {"kb": 1}}\n</parameter>\n'
    '<parameter=tags>\n["a", "b"]\n</parameter>\n<parameter=note>\nnull\n</parameter>\n'
    "</function>\n</tool_call>"
)
WRITE_ARGS = {
    "path": "/tmp/ä.txt",
    "content": "def f():\n    return 1\n",
    "mode": 644,
    "ratio": 0.25,
    "overwrite": True,
    "meta": {"owner": "José", "size": {"kb": 1}},
    "tags": ["a", "b"],
    "note": None,
}

TRANSCRIPTS = [
    ToolTranscript(
        "I'll write the file.\n\n" + WRITE,
        tools=TOOLS,
        expected_calls=[("write_file", WRITE_ARGS)],
        expected_content="I'll write the file.",
        label="content then a typed call",
    ),
    ToolTranscript(
        WRITE + "\n<tool_call>\n<function=list_dir>\n</function>\n</tool_call>",
        tools=TOOLS,
        expected_calls=[("write_file", WRITE_ARGS), ("list_dir", {})],
        expected_content=None,
        label="two calls, one without parameters",
    ),
    ToolTranscript(
        "<function=search>\n<parameter=q>\n42\n</parameter>\n<parameter=lang>\nde\n"
        "</function>\nDone.",
        expected_calls=[("search", {"q": "42", "lang": "de"})],
        expected_content="Done.",
        label="bare function, no schema, missing </parameter>",
    ),
    ToolTranscript(
        "Use <function> tags or <tool_call> blocks, not both.",
        expected_calls=[],
        expected_content="Use <function> tags or <tool_call> blocks, not both.",
        label="prose mentioning tags",
    ),
    ToolTranscript(
        "<tool_call>\n<function=f>\n<parameter=x>\n1\n</parameter>\n</tool_call>",
        expected_calls=[],
        expected_content="<tool_call>\n<function=f>\n<parameter=x>\n1\n</parameter>\n</tool_call>",
        label="missing </function> is content",
    ),
]


class TestQwen3XmlConformance(ToolParserConformance):
    parser_cls = Qwen3XmlToolParser
    transcripts = TRANSCRIPTS


def test_values_that_do_not_fit_the_schema_stay_strings() -> None:
    assert convert_value("12", {"type": "integer"}) == 12
    assert convert_value("twelve", {"type": "integer"}) == "twelve"
    assert convert_value("3", {"type": "number"}) == 3
    assert convert_value("nan", {"type": "number"}) == "nan"
    assert convert_value("yes", {"type": "boolean"}) == "yes"
    assert convert_value("[1]", {"type": "object"}) == "[1]"
    assert convert_value("7", {"anyOf": [{"type": "integer"}, {"type": "null"}]}) == 7
    assert convert_value(" 7 ", None) == " 7 "


def test_without_tools_every_value_is_a_string() -> None:
    result = Qwen3XmlToolParser().extract_tool_calls(WRITE)
    assert result.tool_calls[0].arguments.startswith('{"path": "/tmp/ä.txt"')
    assert '"mode": "644"' in result.tool_calls[0].arguments
