"""The ``engine`` command: the root Typer app and how sub-commands are mounted.

Built in here: ``--version``, ``engine plugins ...`` and ``engine collect-env``. Mounted
lazily, only when invoked or when ``--help`` lists them, so ``engine plugins list`` never
imports what they import (torch):

* ``engine serve|chat|complete|bench`` from the modules in ``COMMAND_MODULES`` when the
  module exists. A module exposes ONE of: ``register(app: typer.Typer) -> None`` (adds its
  commands to ``app``), a function named like the command (``def serve(...)``), or an
  ``app: typer.Typer``.
* commands from plugins' ``register_cli_commands`` hook: a ``typer.Typer`` app (mounted as
  a group) or a function (mounted as one command). Built-in names win over plugin names.
"""

from __future__ import annotations

import importlib
import importlib.util
from types import ModuleType
from typing import Annotated, Any

# Typer's command objects are click's (older typer) or its vendored copy (typer>=0.2x), so
# they are typed as Any here and this module never imports click itself.
import typer
import typer.core
import typer.main

from engine.cli.collect_env import collect_env_command
from engine.cli.plugins_cmd import plugins_app

# command name -> modules that may provide it, first existing one wins.
COMMAND_MODULES: dict[str, tuple[str, ...]] = {
    "serve": ("engine.cli.serve",),
    "chat": ("engine.cli.chat",),
    "complete": ("engine.cli.complete", "engine.cli.chat"),
    "bench": ("engine.cli.bench",),
    "run-batch": ("engine.cli.run_batch",),
}


def _module_exists(module_name: str) -> bool:
    try:
        return importlib.util.find_spec(module_name) is not None
    except ModuleNotFoundError:
        return False


def _import_optional(module_name: str) -> ModuleType | None:
    """Import ``module_name``; ``None`` only when that module itself is missing."""
    try:
        return importlib.import_module(module_name)
    except ModuleNotFoundError as exc:
        if exc.name == module_name:
            return None
        raise


def _single_command(app: typer.Typer, name: str) -> Any:
    group = typer.main.get_group(app)
    command = group.commands.get(name)
    if command is None and len(group.commands) == 1 and app.registered_callback is None:
        command = next(iter(group.commands.values()))
    return command


def _command_from_module(name: str, module: ModuleType) -> Any:
    register = getattr(module, "register", None)
    function = getattr(module, name, None)
    sub_app = getattr(module, "app", None)
    if callable(register):
        holder = typer.Typer()
        register(holder)
        return _single_command(holder, name)
    if callable(function) and not isinstance(function, typer.Typer):
        holder = typer.Typer()
        holder.command(name)(function)
        return _single_command(holder, name)
    if isinstance(sub_app, typer.Typer):
        return typer.main.get_command(sub_app)
    return None


def _command_from_target(name: str, target: Any, help_text: str) -> Any:
    if isinstance(target, typer.Typer):
        command = typer.main.get_command(target)
    else:
        holder = typer.Typer()
        holder.command(name, help=help_text or None)(target)
        command = typer.main.get_group(holder).commands[name]
    command.name = name
    return command


def _plugin_commands() -> dict[str, tuple[Any, str]]:
    """Plugin CLI specs ``{name: (manager, help)}``; a broken plugin setup lists none."""
    from engine.plugins import PluginError, PluginManager

    try:
        pm = PluginManager.load()
    except PluginError:
        return {}
    return {spec.name: (pm, getattr(spec, "help", "")) for spec in pm.specs("cli_command")}


class EngineGroup(typer.core.TyperGroup):
    """The root group: built-in commands, then lazy module commands, then plugin ones."""

    def list_commands(self, ctx: Any) -> list[str]:
        names = list(super().list_commands(ctx))
        for name, modules in COMMAND_MODULES.items():
            if name not in names and any(_module_exists(m) for m in modules):
                names.append(name)
        names += sorted(n for n in _plugin_commands() if n not in names)
        return names

    def get_command(self, ctx: Any, cmd_name: str) -> Any:
        command = super().get_command(ctx, cmd_name)
        if command is not None:
            return command
        for module_name in COMMAND_MODULES.get(cmd_name, ()):
            module = _import_optional(module_name)
            if module is not None:
                command = _command_from_module(cmd_name, module)
                if command is not None:
                    return command
        plugin_commands = _plugin_commands()
        if cmd_name in plugin_commands:
            pm, help_text = plugin_commands[cmd_name]
            target = pm.registry.resolve("cli_command", cmd_name)
            return _command_from_target(cmd_name, target, help_text)
        return None


app = typer.Typer(
    name="engine",
    cls=EngineGroup,
    help="Engine: serve and run open-weight language models.",
    no_args_is_help=True,
    add_completion=False,
)
app.add_typer(plugins_app, name="plugins")
app.command("collect-env")(collect_env_command)


def _version_callback(value: bool) -> None:
    if value:
        import engine_sdk

        import engine

        typer.echo(f"engine {engine.__version__} (engine-sdk {engine_sdk.__version__})")
        raise typer.Exit()


@app.callback()
def root(
    version: Annotated[
        bool,
        typer.Option(
            "--version", callback=_version_callback, is_eager=True, help="Print the version."
        ),
    ] = False,
) -> None:
    """Engine: serve and run open-weight language models."""


def main() -> None:
    """Console-script entry point (``engine``)."""
    app()


if __name__ == "__main__":
    main()
