"""Which plugins to load: ``--plugin NAME`` / ``--plugin no:NAME`` and the environment.

``ENGINE_PLUGINS`` takes the same comma-separated syntax as repeated ``--plugin`` flags;
``ENGINE_PLUGINS_AUTOLOAD=0`` loads only the requested plugins instead of every installed
one; ``ENGINE_TRACE_PLUGINS=1`` logs every hook call.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

from engine.plugins.errors import PluginError

ENV_PLUGINS = "ENGINE_PLUGINS"
ENV_AUTOLOAD = "ENGINE_PLUGINS_AUTOLOAD"
ENV_TRACE = "ENGINE_TRACE_PLUGINS"

_FALSE = {"0", "false", "no", "off"}
_TRUE = {"1", "true", "yes", "on"}


def _flag(env: Mapping[str, str], name: str, default: bool) -> bool:
    raw = env.get(name)
    if raw is None or raw.strip() == "":
        return default
    value = raw.strip().lower()
    if value in _TRUE:
        return True
    if value in _FALSE:
        return False
    raise PluginError(f"{name}={raw!r} is not a boolean; set it to 1 or 0")


@dataclass(frozen=True)
class Activation:
    """The resolved activation: required names, blocked names, autoload and tracing."""

    requested: tuple[str, ...] = ()
    blocked: frozenset[str] = field(default_factory=frozenset)
    autoload: bool = True
    trace: bool = False

    def as_args(self) -> list[str]:
        """The same activation as ``--plugin`` values (for worker processes)."""
        return list(self.requested) + [f"no:{name}" for name in sorted(self.blocked)]


def parse_activation(requested: Sequence[str], env: Mapping[str, str]) -> Activation:
    """Merge ``--plugin`` values with ``ENGINE_PLUGINS``; conflicting entries are an error."""
    items: list[tuple[str, str]] = [(value, "--plugin") for value in requested]
    items += [(value, ENV_PLUGINS) for value in env.get(ENV_PLUGINS, "").split(",")]
    wanted: list[str] = []
    blocked: set[str] = set()
    for raw, source in items:
        value = raw.strip()
        if not value:
            continue
        if value.startswith("no:"):
            name = value[3:].strip()
            if not name:
                raise PluginError(f"{source} {value!r}: write no:NAME to block plugin NAME")
            blocked.add(name)
        elif value not in wanted:
            wanted.append(value)
    conflicts = sorted(blocked.intersection(wanted))
    if conflicts:
        raise PluginError(
            f"plugin(s) {', '.join(conflicts)} are both requested and blocked (no:NAME); "
            f"remove one of the two from --plugin / {ENV_PLUGINS}"
        )
    return Activation(
        requested=tuple(wanted),
        blocked=frozenset(blocked),
        autoload=_flag(env, ENV_AUTOLOAD, True),
        trace=_flag(env, ENV_TRACE, False),
    )
