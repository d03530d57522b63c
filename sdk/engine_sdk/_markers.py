"""The pluggy markers of the project "engine"."""

from __future__ import annotations

import pluggy

PROJECT_NAME = "engine"
ENTRY_POINT_GROUP = "engine.plugins"

hookspec = pluggy.HookspecMarker(PROJECT_NAME)
hookimpl = pluggy.HookimplMarker(PROJECT_NAME)
