"""Test helpers for plugin authors: an isolated plugin manager and conformance suites.

``engine_sdk.testing.pytest_plugin`` is registered with pytest automatically and provides
the ``engine_plugin_manager`` and ``tiny_model_dir`` fixtures. Nothing here imports torch;
``engine_sdk.testing.models`` (tiny random checkpoints) does, and is imported on use.
"""

from __future__ import annotations

from engine_sdk.testing.conformance import (
    ConformanceReport,
    PluginConformance,
    assert_plugin_conforms,
    check_plugin,
)
from engine_sdk.testing.plugin_manager import IsolatedPluginManager

__all__ = [
    "ConformanceReport",
    "IsolatedPluginManager",
    "PluginConformance",
    "assert_plugin_conforms",
    "check_plugin",
]
