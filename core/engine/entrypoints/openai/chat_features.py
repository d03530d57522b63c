"""Which tool-call and reasoning parsers the server uses, resolved once at startup.

``--tool-call-parser NAME`` names an installed tool parser plugin or one defined in
``--tool-parser-plugin FILE``: a local ``.py`` file (the operator's own code, imported from
its path) whose ``ToolParser`` subclasses with a ``name`` are registered, as are the specs
returned by a ``register_tool_parsers()`` function in it (``module:Class`` targets, where
the module may be the file itself). ``--reasoning-parser NAME`` comes from ``EngineArgs``.
Misconfiguration refuses to start, naming the flag and what is installed.
"""

from __future__ import annotations

import importlib
import importlib.util
import inspect
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from engine_sdk.interfaces.reasoning_parser import ReasoningParser
from engine_sdk.interfaces.tool_parser import ToolParser

from engine.errors import StartupError

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
    tool_parsers: dict[str, type[ToolParser]] = field(default_factory=dict)

    @property
    def auto_tool_choice(self) -> bool:
        return self.enable_auto_tool_choice and self.tool_parser_cls is not None


def load_chat_features(engine_args: Any, server_args: Any, pm: Any | None = None) -> ChatFeatures:
    """Resolve the parser flags; ``StartupError`` naming the flag when one is wrong."""
    if server_args.enable_auto_tool_choice and not server_args.tool_call_parser:
        raise StartupError(
            "--enable-auto-tool-choice requires --tool-call-parser NAME (the format the "
            "model writes tool calls in, e.g. hermes for Qwen)"
        )
    needs_plugins = server_args.tool_call_parser or engine_args.reasoning_parser
    if pm is None and needs_plugins:
        from engine.plugins import PluginManager

        pm = PluginManager.load(requested=engine_args.plugins)
    tool_parsers: dict[str, type[ToolParser]] = {}
    if server_args.tool_parser_plugin:
        tool_parsers.update(load_tool_parser_plugin(server_args.tool_parser_plugin))
    features = ChatFeatures(
        enable_auto_tool_choice=bool(server_args.enable_auto_tool_choice),
        tool_parsers=tool_parsers,
    )
    if server_args.tool_call_parser:
        features.tool_parser_cls = _tool_parser(pm, server_args.tool_call_parser, tool_parsers)
    if engine_args.reasoning_parser:
        from engine.structured_output.setup import resolve_reasoning_parser

        features.reasoning_parser_cls = resolve_reasoning_parser(pm, engine_args.reasoning_parser)
    return features


def _tool_parser(pm: Any, name: str, from_file: dict[str, type[ToolParser]]) -> type[ToolParser]:
    if name in from_file:
        return from_file[name]
    installed = sorted({*pm.registry.names("tool_parser"), *from_file})
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


def load_tool_parser_plugin(path: str) -> dict[str, type[ToolParser]]:
    """The tool parsers a local ``.py`` file defines, by name."""
    file = Path(path).expanduser()
    if not file.is_file() or file.suffix != ".py":
        raise StartupError(f"--tool-parser-plugin {path!r} is not a .py file")
    module_name = f"engine_tool_parser_plugin_{file.stem}"
    spec = importlib.util.spec_from_file_location(module_name, file)
    if spec is None or spec.loader is None:
        raise StartupError(f"--tool-parser-plugin {path!r} cannot be imported")
    module = importlib.util.module_from_spec(spec)
    sys.modules[module_name] = module  # so its own "module:Class" targets resolve
    try:
        spec.loader.exec_module(module)
    except Exception as exc:
        sys.modules.pop(module_name, None)
        raise StartupError(
            f"--tool-parser-plugin {path!r} failed to import: {type(exc).__name__}: {exc}"
        ) from exc
    found: dict[str, type[ToolParser]] = {}
    for _, obj in inspect.getmembers(module, inspect.isclass):
        name = getattr(obj, "name", "")
        if issubclass(obj, ToolParser) and obj.__module__ == module_name and name:
            if not inspect.isabstract(obj):
                found[name] = obj
    register = getattr(module, "register_tool_parsers", None)
    if callable(register):
        for tool_spec in register() or []:
            found[tool_spec.name] = _load_target(tool_spec.target, module, path)
    if not found:
        raise StartupError(
            f"--tool-parser-plugin {path!r} defines no tool parser: subclass "
            "engine_sdk.interfaces.tool_parser.ToolParser and set its name"
        )
    return found


def _load_target(target: str, module: Any, path: str) -> type[ToolParser]:
    module_part, _, attr = target.partition(":")
    try:
        owner = module if module_part in ("", module.__name__, Path(path).stem) else None
        if owner is None:
            owner = importlib.import_module(module_part)
        obj = getattr(owner, attr)
    except (ImportError, AttributeError) as exc:
        raise StartupError(
            f"--tool-parser-plugin {path!r}: cannot load {target!r}: {exc}"
        ) from None
    if not (inspect.isclass(obj) and issubclass(obj, ToolParser)):
        raise StartupError(f"--tool-parser-plugin {path!r}: {target!r} is not a ToolParser")
    return obj
