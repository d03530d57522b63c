"""Tool-call and reasoning parser classes named by the server's flags, resolved through
the plugin registry (the API's front end gets the classes, never the plugin manager).

``--tool-call-parser NAME`` names a tool parser in the plugin registry: an installed
plugin's, or one defined in ``--tool-parser-plugin FILE``, a local ``.py`` file (the
operator's own code, imported from its path) whose ``ToolParser`` subclasses with a
``name`` are registered, as are the specs returned by a ``register_tool_parsers()``
function in it (``module:Class`` targets, where the module may be the file itself).
``--reasoning-parser NAME`` comes from ``EngineArgs``. Misconfiguration is a
``StartupError`` naming the flag and what is installed.
"""

from __future__ import annotations

import importlib.util
import inspect
import sys
from dataclasses import dataclass, replace
from pathlib import Path
from types import ModuleType

from engine_sdk.interfaces.reasoning_parser import ReasoningParser
from engine_sdk.interfaces.tool_parser import ToolParser
from engine_sdk.specs import ToolParserSpec

from engine.errors import StartupError
from engine.plugins.errors import PluginError
from engine.plugins.manager import PluginManager

__all__ = ["ChatParsers", "load_tool_parser_plugin", "resolve_chat_parsers"]


@dataclass(frozen=True)
class ChatParsers:
    """The parser classes the flags name (None: that flag is unset)."""

    tool_parser_cls: type[ToolParser] | None = None
    reasoning_parser_cls: type[ReasoningParser] | None = None


def resolve_chat_parsers(
    plugins: list[str] | None,
    tool_call_parser: str | None,
    reasoning_parser: str | None,
    tool_parser_plugin: str | None,
) -> ChatParsers:
    """The classes of ``--tool-call-parser`` and ``--reasoning-parser``, after registering
    ``--tool-parser-plugin``'s parsers; plugins load (``plugins``: ``--plugin``) only when
    a flag needs them. ``StartupError`` naming the flag when one is wrong."""
    if not (tool_call_parser or reasoning_parser or tool_parser_plugin):
        return ChatParsers()
    pm = PluginManager.load(requested=plugins)
    if tool_parser_plugin:
        load_tool_parser_plugin(tool_parser_plugin, pm)
    tool_cls = _tool_parser(pm, tool_call_parser) if tool_call_parser else None
    reasoning_cls = None
    if reasoning_parser:
        from engine.structured_output.setup import resolve_reasoning_parser

        reasoning_cls = resolve_reasoning_parser(pm, reasoning_parser)
    return ChatParsers(tool_cls, reasoning_cls)


def _tool_parser(pm: PluginManager, name: str) -> type[ToolParser]:
    installed = pm.registry.names("tool_parser")
    if name not in installed:
        raise StartupError(
            f"--tool-call-parser {name!r} is not installed; installed tool parsers: "
            f"{', '.join(installed) or 'none (pip install engine-toolparsers)'} "
            "(or define one in --tool-parser-plugin FILE)"
        )
    try:
        parser_cls: type[ToolParser] = pm.registry.resolve("tool_parser", name)
    except Exception as exc:
        raise StartupError(f"--tool-call-parser {name!r}: {exc}") from None
    return parser_cls


def _import_file(file: Path, path: str) -> ModuleType:
    module_name = f"engine_tool_parser_plugin_{file.stem}"
    spec = importlib.util.spec_from_file_location(module_name, file)
    if spec is None or spec.loader is None:
        raise StartupError(f"--tool-parser-plugin {path!r} cannot be imported")
    module = importlib.util.module_from_spec(spec)
    sys.modules[module_name] = module  # so "module:Class" targets resolve through it
    try:
        spec.loader.exec_module(module)
    except Exception as exc:
        sys.modules.pop(module_name, None)
        raise StartupError(
            f"--tool-parser-plugin {path!r} failed to import: {type(exc).__name__}: {exc}"
        ) from exc
    return module


def _file_specs(module: ModuleType, stem: str) -> list[ToolParserSpec]:
    """Specs for the file's named ``ToolParser`` subclasses and its
    ``register_tool_parsers()``; targets naming the file (by stem) point at the module."""
    specs = []
    for _, obj in inspect.getmembers(module, inspect.isclass):
        if issubclass(obj, ToolParser) and obj.__module__ == module.__name__ and obj.name:
            if not inspect.isabstract(obj):
                specs.append(ToolParserSpec(obj.name, f"{module.__name__}:{obj.__qualname__}"))
    register = getattr(module, "register_tool_parsers", None)
    for tool_spec in (register() or []) if callable(register) else []:
        module_part, _, attr = tool_spec.target.partition(":")
        if module_part in (module.__name__, stem):
            tool_spec = replace(tool_spec, target=f"{module.__name__}:{attr}")
        specs.append(tool_spec)
    return specs


def load_tool_parser_plugin(path: str, pm: PluginManager) -> list[str]:
    """Register the tool parsers a local ``.py`` file defines in ``pm``'s registry, like
    an installed plugin's (a name clash is an error, not an override); their names."""
    file = Path(path).expanduser()
    if not file.is_file() or file.suffix != ".py":
        raise StartupError(f"--tool-parser-plugin {path!r} is not a .py file")
    module = _import_file(file, path)
    specs = _file_specs(module, file.stem)
    if not specs:
        raise StartupError(
            f"--tool-parser-plugin {path!r} defines no tool parser: subclass "
            "engine_sdk.interfaces.tool_parser.ToolParser and set its name"
        )
    try:
        pm.register_local(f"tool-parser-plugin:{file.name}", str(file), specs)
        for spec in specs:
            pm.registry.resolve("tool_parser", spec.name)
    except PluginError as exc:
        raise StartupError(f"--tool-parser-plugin {path!r}: {exc}") from None
    return [spec.name for spec in specs]
