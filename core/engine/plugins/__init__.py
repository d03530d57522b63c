"""The plugin system: discover, activate and load plugins; resolve what they provide.

``PluginManager.load(requested=..., env=...)`` builds one explicitly (no global instance);
``pm.registry`` resolves specs by (kind, name); ``registry.toml`` is read by ``Catalogue``.
"""

from __future__ import annotations

from engine.plugins.activation import Activation, parse_activation
from engine.plugins.catalogue import Catalogue, CatalogueEntry
from engine.plugins.errors import PluginError
from engine.plugins.info import PluginInfo
from engine.plugins.manager import PluginManager
from engine.plugins.registry import Registry

__all__ = [
    "Activation",
    "Catalogue",
    "CatalogueEntry",
    "PluginError",
    "PluginInfo",
    "PluginManager",
    "Registry",
    "parse_activation",
]
