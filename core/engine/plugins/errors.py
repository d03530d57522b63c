"""The error the plugin system raises: what was wrong with which plugin, and what to do."""

from __future__ import annotations

from engine.errors import EngineError


class PluginError(EngineError):
    """A plugin is missing, broken, conflicting or unsuitable; the message says the fix."""

    code = "plugin_error"
