"""Checks on a plugin's metadata before it is imported: its SDK range and its dependencies.

Both read package metadata only, so ``engine plugins list`` can show why a plugin cannot
work (``engine-gguf`` installed without ``gguf``) without importing its code or torch.
"""

from __future__ import annotations

from importlib import metadata

from engine.plugins.versions import specifier_contains

__all__ = ["missing_dependencies", "sdk_refusal"]


def sdk_refusal(
    plugin: str, dist: str | None, requirement: str | None, sdk_version: str
) -> str | None:
    """One line saying why ``plugin`` cannot load with this SDK, or ``None`` when it can."""
    if requirement is None:
        return None
    try:
        compatible = specifier_contains(requirement, sdk_version)
    except ValueError:
        return None  # an unreadable range is shown as "?" by `engine plugins list`
    if compatible:
        return None
    owner = dist or plugin
    return (
        f"{owner} requires engine-sdk{requirement} but engine-sdk {sdk_version} is installed; "
        f"install a release of {owner} built for engine-sdk {sdk_version}"
    )


def missing_dependencies(requires: tuple[str, ...]) -> list[str]:
    """Declared requirements (``Requires-Dist``, extras excluded) that are not installed or
    whose installed version is outside the declared range, as ``pip install`` arguments.

    ``engine-sdk`` is left to :func:`sdk_refusal`. Without ``packaging`` nothing is checked.
    """
    try:
        from packaging.requirements import InvalidRequirement, Requirement
    except ImportError:  # pragma: no cover - engine depends on packaging
        return []
    missing: list[str] = []
    for text in requires:
        try:
            requirement = Requirement(text)
        except InvalidRequirement:
            continue
        if requirement.marker is not None and not requirement.marker.evaluate({"extra": ""}):
            continue
        if requirement.name.lower().replace("_", "-") == "engine-sdk":
            continue
        try:
            version = metadata.version(requirement.name)
        except metadata.PackageNotFoundError:
            missing.append(str(requirement))
            continue
        if not requirement.specifier.contains(version, prereleases=True):
            missing.append(f"{requirement} (installed: {version})")
    return missing
