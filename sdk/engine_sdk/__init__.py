"""engine-sdk: the contract between Engine and its plugins.

Import what a plugin's entry-point module needs from here (``hookimpl`` and the spec
records); it never imports torch. Base classes live in ``engine_sdk.interfaces.*`` and are
imported by a plugin's implementation modules, which the engine loads lazily.
"""

from __future__ import annotations

from engine_sdk._markers import ENTRY_POINT_GROUP, PROJECT_NAME, hookimpl, hookspec
from engine_sdk.specs import (
    SPEC_KINDS,
    AttentionBackendSpec,
    CLICommandSpec,
    ModelArchitectureSpec,
    ModelFormatSpec,
    PluginSpec,
    PoolingModelSpec,
    QuantizationMethodSpec,
    ReasoningParserSpec,
    StructuredOutputBackendSpec,
    ToolParserSpec,
)

__version__ = "0.1.3"
# The contract version. Plugins declare a compatible range (``engine-sdk>=0.1,<0.2``);
# the minor number grows when hooks or base classes change incompatibly before 1.0.
__api_version__ = "0.1"

__all__ = [
    "ENTRY_POINT_GROUP",
    "PROJECT_NAME",
    "SPEC_KINDS",
    "AttentionBackendSpec",
    "CLICommandSpec",
    "ModelArchitectureSpec",
    "ModelFormatSpec",
    "PluginSpec",
    "PoolingModelSpec",
    "QuantizationMethodSpec",
    "ReasoningParserSpec",
    "StructuredOutputBackendSpec",
    "ToolParserSpec",
    "__api_version__",
    "hookimpl",
    "hookspec",
]
