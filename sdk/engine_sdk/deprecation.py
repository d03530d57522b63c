"""Deprecation markers of the plugin contract: hooks and base-class members.

A deprecated name keeps working for at least one minor release and warns, naming the
version that removes it and what to use instead (docs/plugins/compatibility.md):

- a hook: ``@hookspec(warn_on_impl=deprecated_hook_warning(...))``, so pluggy warns when a
  plugin implements it;
- a base-class member: listed in :data:`DEPRECATIONS`; the base class calls
  :func:`warn_deprecated_members` from ``__init_subclass__``, so defining it in a
  subclass warns when the plugin's module is imported.

:data:`DEPRECATIONS` is the record the API snapshot test reads: a public name may leave
``sdk/api_snapshot.json`` only once it is listed here and the SDK version has reached its
``removed_in``.
"""

from __future__ import annotations

import warnings
from collections.abc import Mapping
from dataclasses import dataclass
from types import MappingProxyType

__all__ = [
    "DEPRECATIONS",
    "Deprecation",
    "SDKDeprecationWarning",
    "deprecated_hook_warning",
    "deprecated_members",
    "warn_deprecated_members",
]


class SDKDeprecationWarning(DeprecationWarning):
    """A plugin uses a part of engine-sdk that a later release removes."""


@dataclass(frozen=True)
class Deprecation:
    """``since``: the SDK version that deprecated it; ``removed_in``: the one that removes
    it; ``instead``: what to use now."""

    since: str
    removed_in: str
    instead: str

    def message(self, what: str) -> str:
        return (
            f"{what} is deprecated since engine-sdk {self.since} and is removed in "
            f"engine-sdk {self.removed_in}; {self.instead}"
        )


# Every deprecated public name, as the API snapshot writes it: "module:Class.member" for a
# class member, "module.name" for a module-level name (a hook is "engine_sdk.hookspecs.NAME").
DEPRECATIONS: Mapping[str, Deprecation] = MappingProxyType(
    {
        "engine_sdk.interfaces.model:ModelArchitecture.architectures": Deprecation(
            since="0.1.1",
            removed_in="0.2.0",
            instead="declare the names once, in ModelArchitectureSpec.architectures",
        ),
    }
)


def deprecated_members(owner: str) -> dict[str, Deprecation]:
    """The deprecated members of class ``owner`` (``"module:Class"``), by member name."""
    prefix = f"{owner}."
    return {k.removeprefix(prefix): v for k, v in DEPRECATIONS.items() if k.startswith(prefix)}


def deprecated_hook_warning(hook: str, deprecation: Deprecation) -> SDKDeprecationWarning:
    """The ``warn_on_impl`` value of a deprecated hookspec."""
    return SDKDeprecationWarning(deprecation.message(f"hook {hook}()"))


def warn_deprecated_members(cls: type, deprecated: Mapping[str, Deprecation]) -> None:
    """Warn once per deprecated member that subclass ``cls`` defines itself."""
    for name, deprecation in deprecated.items():
        if name in vars(cls):
            what = f"{cls.__module__}.{cls.__qualname__}.{name}"
            warnings.warn(deprecation.message(what), SDKDeprecationWarning, stacklevel=3)
