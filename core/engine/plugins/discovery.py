"""Find installed plugins: entry points in the group ``engine.plugins``.

Discovery reads package metadata only; nothing is imported until the manager loads a
plugin it decided to activate.
"""

from __future__ import annotations

from dataclasses import dataclass
from importlib import metadata

from engine_sdk import ENTRY_POINT_GROUP


@dataclass(frozen=True)
class Candidate:
    """An installed entry point: plugin ``name`` -> ``value`` (the plugin module/object)."""

    name: str
    value: str
    dist: str | None
    version: str | None
    requires: tuple[str, ...]
    entry_point: metadata.EntryPoint


def discover_entry_points() -> list[Candidate]:
    """Every ``engine.plugins`` entry point, one per (name, distribution), sorted by name."""
    seen: set[tuple[str, str | None]] = set()
    found: list[Candidate] = []
    for ep in metadata.entry_points(group=ENTRY_POINT_GROUP):
        dist = ep.dist
        dist_name = dist.metadata["Name"] if dist is not None else None
        key = (ep.name, dist_name)
        if key in seen:  # the same distribution seen twice on sys.path
            continue
        seen.add(key)
        found.append(
            Candidate(
                name=ep.name,
                value=ep.value,
                dist=dist_name,
                version=dist.version if dist is not None else None,
                requires=tuple(dist.requires or ()) if dist is not None else (),
                entry_point=ep,
            )
        )
    return sorted(found, key=lambda c: (c.name, c.dist or ""))
