#!/usr/bin/env python3
"""The public names of engine_sdk, checked in as sdk/api_snapshot.json.

    python scripts/sdk_api_snapshot.py           # rewrite sdk/api_snapshot.json
    python scripts/sdk_api_snapshot.py --check   # exit 1 when the snapshot is out of date

A public name is a module's ``__all__`` (else its public classes, functions and UPPER_CASE
constants) and, for each public class, its public members. tests/foundation/
test_sdk_api_snapshot.py fails when a name in the snapshot disappears without a finished
deprecation cycle (``engine_sdk.deprecation.REMOVALS``) and when a new name is missing
from the snapshot, so every change to the contract shows up in review.
"""

from __future__ import annotations

import importlib
import inspect
import json
import pkgutil
import sys
from pathlib import Path
from types import ModuleType

import engine_sdk

SNAPSHOT_PATH = Path(__file__).resolve().parents[1] / "sdk" / "api_snapshot.json"


def _modules() -> list[ModuleType]:
    found = [engine_sdk]
    for info in pkgutil.walk_packages(engine_sdk.__path__, "engine_sdk."):
        if any(part.startswith("_") for part in info.name.split(".")):
            continue
        found.append(importlib.import_module(info.name))
    return sorted(found, key=lambda m: m.__name__)


def _module_names(module: ModuleType) -> list[str]:
    exported = getattr(module, "__all__", None)
    if exported is not None:
        return sorted(exported)
    names = []
    for name, obj in vars(module).items():
        if name.startswith("_"):
            continue
        defined_here = getattr(obj, "__module__", None) == module.__name__
        if (inspect.isclass(obj) or inspect.isfunction(obj)) and defined_here:
            names.append(name)
        elif name.isupper():
            names.append(name)
    return sorted(names)


def _class_members(cls: type) -> list[str]:
    names = set(vars(cls)) | set(vars(cls).get("__annotations__", {}))
    return sorted(n for n in names if not n.startswith("_"))


def public_api() -> dict[str, list[str]]:
    """``{"module": [names], "module:Class": [members]}`` for every public module."""
    api: dict[str, list[str]] = {}
    for module in _modules():
        names = _module_names(module)
        api[module.__name__] = names
        for name in names:
            obj = getattr(module, name, None)
            if inspect.isclass(obj) and obj.__module__ == module.__name__:
                api[f"{module.__name__}:{name}"] = _class_members(obj)
    return api


def flatten(api: dict[str, list[str]]) -> set[str]:
    """``module.name`` / ``module:Class.member`` strings, one per public name."""
    flat = set()
    for owner, names in api.items():
        sep = "." if ":" in owner else ":"
        flat.update(f"{owner}{sep}{name}" for name in names)
    return flat


def main(argv: list[str]) -> int:
    text = json.dumps(public_api(), indent=1, sort_keys=True) + "\n"
    if "--check" in argv:
        current = SNAPSHOT_PATH.read_text() if SNAPSHOT_PATH.exists() else ""
        if current != text:
            print(f"{SNAPSHOT_PATH} is out of date; run: python scripts/sdk_api_snapshot.py")
            return 1
        return 0
    SNAPSHOT_PATH.write_text(text)
    print(f"wrote {SNAPSHOT_PATH}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
