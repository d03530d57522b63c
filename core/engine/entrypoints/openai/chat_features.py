"""Which tool-call and reasoning parsers the server uses, resolved once at startup.

``--tool-call-parser NAME`` names a tool parser in the plugin registry: an installed
plugin's, or one defined in ``--tool-parser-plugin FILE``, a local ``.py`` file (the
operator's own code, imported from its path) whose ``ToolParser`` subclasses with a
``name`` are registered, as are the specs returned by a ``register_tool_parsers()``
function in it (``module:Class`` targets, where the module may be the file itself).
``--reasoning-parser NAME`` comes from ``EngineArgs``.
Misconfiguration refuses to start, naming the flag and what is installed.
"""

from __future__ import annotations

import importlib.util
import inspect
import sys
from dataclasses import dataclass, replace
from pathlib import Path
from types import ModuleType
from typing import TYPE_CHECKING, Any

from engine_sdk.interfaces.reasoning_parser import ReasoningParser
from engine_sdk.interfaces.tool_parser import ToolParser
from engine_sdk.specs import ToolParserSpec

from engine.errors import StartupError
from engine.plugins.errors import PluginError

if TYPE_CHECKING:
    from engine.plugins import PluginManager

AUTO_TOOL_CHOICE_HINT = (
    '"auto" tool choice requires --enable-auto-tool-choice and --tool-call-parser to be set '
    'on the server; send tool_choice "required", a named function or "none" instead'
)


@dataclass
class ChatFeatures:
    """The server's parsers; the default (no flags) parses nothing."""

    tool_parser_cls: type[ToolParser] | None = None
    enable_auto_tool_choice: bool = False
    reasoning_parser_cls: type[ReasoningParser] | None = None

    @property
    def auto_tool_choice(self) -> bool:
        return self.enable_auto_tool_choice and self.tool_parser_cls is not None


def load_chat_features(
    engine_args: Any, server_args: Any, pm: PluginManager | None = None
) -> ChatFeatures:
    """Resolve the parser flags; ``StartupError`` naming the flag when one is wrong."""
    if server_args.enable_auto_tool_choice and not server_args.tool_call_parser:
        raise StartupError(
            "--enable-auto-tool-choice requires --tool-call-parser NAME (the format the "
            "model writes tool calls in, e.g. hermes for Qwen)"
        )
    needs_plugins = (
        server_args.tool_call_parser
        or engine_args.reasoning_parser
        or server_args.tool_parser_plugin
    )
    if pm is None and needs_plugins:
        from engine.plugins import PluginManager

        pm = PluginManager.load(requested=engine_args.plugins)
    if server_args.tool_parser_plugin:
        assert pm is not None
        load_tool_parser_plugin(server_args.tool_parser_plugin, pm)
    features = ChatFeatures(enable_auto_tool_choice=bool(server_args.enable_auto_tool_choice))
    if server_args.tool_call_parser:
        assert pm is not None
        features.tool_parser_cls = _tool_parser(pm, server_args.tool_call_parser)
    if engine_args.reasoning_parser:
        from engine.structured_output.setup import resolve_reasoning_parser

        features.reasoning_parser_cls = resolve_reasoning_parser(pm, engine_args.reasoning_parser)
    return features


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
