"""The plugin module: hooks, names, lazy targets, no torch import."""

from __future__ import annotations

import engine_toolparsers.plugin
from engine_sdk.testing import PluginConformance


class TestPluginConformance(PluginConformance):
    plugin = engine_toolparsers.plugin


def test_provides_the_five_parsers() -> None:
    names = [spec.name for spec in engine_toolparsers.plugin.register_tool_parsers()]
    assert names == ["hermes", "llama3_json", "mistral", "pythonic", "qwen3_xml"]
