"""``engine plugins list``: what is installed, what it provides, and what else exists.

Reads entry points, the plugins' hooks (which never import torch) and ``registry.toml``;
never imports a spec's target, so it stays fast and works without torch installed.
"""

from __future__ import annotations

import json
import sys
from typing import TYPE_CHECKING, Annotated, Any

import typer

if TYPE_CHECKING:
    from engine.plugins import Catalogue, CatalogueEntry, PluginInfo, PluginManager

plugins_app = typer.Typer(help="Inspect installed and available plugins.", no_args_is_help=True)


def _provides_text(provides: dict[str, list[str]]) -> str:
    return "; ".join(f"{kind}: {', '.join(names)}" for kind, names in provides.items()) or "-"


def _sdk_text(info: PluginInfo, sdk_version: str) -> str:
    if info.sdk_requirement is None:
        return "-" if info.dist is None else "? (no engine-sdk requirement)"
    if info.sdk_compatible is False:
        return f"NO: needs engine-sdk{info.sdk_requirement}, have {sdk_version}"
    if info.sdk_compatible is None:
        return f"? ({info.sdk_requirement})"
    return f"ok ({info.sdk_requirement})"


def _known(info: PluginInfo, catalogue: Catalogue) -> bool:
    entry = catalogue.get(info.name)
    return entry is not None and (info.dist is None or entry.distribution == info.dist)


def _table(headers: list[str], rows: list[list[str]]) -> str:
    widths = [max(len(r[i]) for r in [headers, *rows]) for i in range(len(headers))]
    lines = []
    for row in [headers, *rows]:
        cells = [cell.ljust(width) for cell, width in zip(row, widths, strict=True)]
        lines.append("  ".join(cells).rstrip())
    return "\n".join(lines)


def _filter_kind(provides: dict[str, list[str]], kind: str | None) -> dict[str, list[str]]:
    if kind is None:
        return provides
    return {k: v for k, v in provides.items() if k == kind}


def _capabilities(info: PluginInfo, kind: str | None) -> dict[str, dict[str, Any]]:
    """kind -> spec name -> declared capabilities (specs that declare any)."""
    caps: dict[str, dict[str, Any]] = {}
    for spec_kind, specs in info.specs.items():
        if kind is not None and spec_kind != kind:
            continue
        declared = {spec.name: spec.capabilities() for spec in specs if spec.capabilities()}
        if declared:
            caps[spec_kind] = declared
    return caps


def _hardware_text(caps: dict[str, Any]) -> str | None:
    """``cuda (capability >= 8.9); reference: cpu`` from a spec's devices fields."""
    devices = caps.get("devices")
    if not devices:
        return None
    text = ", ".join(devices)
    min_capability = caps.get("min_capability")
    if min_capability:
        text += f" (capability >= {min_capability // 10}.{min_capability % 10})"
    if caps.get("reference_devices"):
        text += f"; reference: {', '.join(caps['reference_devices'])}"
    return text


def _installed_rows(pm: PluginManager, kind: str | None) -> list[dict[str, Any]]:
    import engine_sdk

    rows = []
    for info in pm.plugins:
        provides = _filter_kind(info.provides(), kind)
        if kind is not None and not provides:
            continue
        row = info.as_dict()
        row["provides"] = provides
        row["capabilities"] = _capabilities(info, kind)
        row["sdk"] = _sdk_text(info, engine_sdk.__version__)
        row["known_to_registry"] = _known(info, pm.catalogue)
        rows.append(row)
    return rows


def _available_entries(pm: PluginManager, kind: str | None) -> list[CatalogueEntry]:
    installed = {info.name for info in pm.plugins} | {info.dist for info in pm.plugins}
    entries = []
    for entry in pm.catalogue.entries.values():
        if entry.name in installed or entry.distribution in installed:
            continue
        if kind is not None and kind not in entry.provides:
            continue
        entries.append(entry)
    return entries


def _print_installed(rows: list[dict[str, Any]]) -> None:
    if not rows:
        typer.echo("no plugins found (install one, or see `engine plugins list --available`)")
        return
    headers = ["NAME", "DISTRIBUTION", "VERSION", "PROVIDES", "SDK", "STATUS", "REGISTRY"]
    table = [
        [
            row["name"],
            row["distribution"] or "(extra)",
            row["version"] or "-",
            _provides_text(row["provides"]),
            row["sdk"],
            row["status"],
            "yes" if row["known_to_registry"] else "no",
        ]
        for row in rows
    ]
    typer.echo(_table(headers, table))
    hardware = [
        [f"{kind} {name}", text]
        for row in rows
        for kind, specs in row["capabilities"].items()
        for name, caps in specs.items()
        if kind != "attention_backend" and (text := _hardware_text(caps)) is not None
    ]
    if hardware:
        typer.echo("\n" + _table(["METHOD", "HARDWARE"], hardware))
    for row in rows:
        if row["error"]:
            typer.echo(f"\n{row['name']} failed: {row['error']}")


def _print_available(entries: list[CatalogueEntry], catalogue: Catalogue) -> None:
    if catalogue.source is None:
        typer.echo(
            "no registry.toml found: set ENGINE_REGISTRY=PATH to a catalogue, or run from a "
            "source checkout of engine"
        )
        return
    if not entries:
        typer.echo(f"every plugin in {catalogue.source} is installed")
        return
    headers = ["NAME", "DISTRIBUTION", "STATUS", "PROVIDES", "HARDWARE", "INSTALL"]
    table = [
        [
            e.name,
            e.distribution,
            e.status,
            _provides_text(e.provides),
            ", ".join(e.hardware) or "-",
            e.install_command(),
        ]
        for e in entries
    ]
    typer.echo(_table(headers, table))


@plugins_app.command("list")
def list_plugins(
    as_json: Annotated[bool, typer.Option("--json", help="Print JSON.")] = False,
    kind: Annotated[
        str | None, typer.Option("--kind", help="Only plugins providing this kind.")
    ] = None,
    available: Annotated[
        bool, typer.Option("--available", help="Plugins in registry.toml not installed.")
    ] = False,
    plugin: Annotated[
        list[str] | None,
        typer.Option("--plugin", help="Require (NAME) or block (no:NAME) a plugin; repeatable."),
    ] = None,
    explain: Annotated[
        bool,
        typer.Option(
            "--explain",
            help="Which attention backends and quantization methods fit this run, and every "
            "reason the others refuse (imports torch to find the GPU).",
        ),
    ] = False,
    device: Annotated[str, typer.Option("--device", help="With --explain: cpu, cuda or auto.")] = (
        "auto"
    ),
    dtype: Annotated[str, typer.Option("--dtype", help="With --explain: the model dtype.")] = (
        "bfloat16"
    ),
    block_size: Annotated[int, typer.Option("--block-size", help="With --explain.")] = 16,
    kv_cache_dtype: Annotated[str, typer.Option("--kv-cache-dtype", help="With --explain.")] = (
        "auto"
    ),
    head_size: Annotated[
        int | None, typer.Option("--head-size", help="With --explain: the model's head size.")
    ] = None,
    capability: Annotated[
        float | None,
        typer.Option("--capability", help="With --explain: a GPU's compute capability (8.0)."),
    ] = None,
) -> None:
    """List plugins: name, distribution, what they provide, SDK compatibility, status."""
    import engine_sdk

    from engine.plugins import PluginError, PluginManager

    if kind is not None and kind not in engine_sdk.SPEC_KINDS:
        raise typer.BadParameter(
            f"unknown kind {kind!r}; use one of: {', '.join(engine_sdk.SPEC_KINDS)}",
            param_hint="--kind",
        )
    try:
        pm = PluginManager.load(requested=plugin or ())
    except PluginError as exc:
        typer.echo(f"error: {exc}", err=True)
        raise typer.Exit(1) from None
    if explain:
        from engine.cli.plugins_explain import detect_device, print_explain
        from engine.cli.plugins_explain import explain as explain_run
        from engine.plugins.capabilities import AttentionNeeds, QuantizationNeeds

        found, detected = detect_device(device)
        cap = round(capability * 10) if capability is not None else detected
        needs = AttentionNeeds(found, dtype, block_size, kv_cache_dtype, cap, head_size)
        report = explain_run(pm, needs, QuantizationNeeds(found, cap))
        if as_json:
            typer.echo(json.dumps(report, indent=2))
        else:
            print_explain(report)
        return
    if available:
        entries = _available_entries(pm, kind)
        if as_json:
            typer.echo(json.dumps({"available": [e.as_dict() for e in entries]}, indent=2))
        else:
            _print_available(entries, pm.catalogue)
        return
    rows = _installed_rows(pm, kind)
    if as_json:
        payload = {
            "engine_sdk_version": engine_sdk.__version__,
            "registry": str(pm.catalogue.source) if pm.catalogue.source else None,
            "plugins": rows,
        }
        json.dump(payload, sys.stdout, indent=2)
        sys.stdout.write("\n")
    else:
        _print_installed(rows)


@plugins_app.command("new")
def new_plugin(
    name: Annotated[str, typer.Argument(help="Plugin name: lower-case, digits and '_'.")],
    kind: Annotated[str, typer.Option("--kind", help="What the plugin provides.")],
    directory: Annotated[
        str, typer.Option("--dir", help="Folder to write engine-NAME/ into.")
    ] = ".",
) -> None:
    """Write a new plugin package (with tests) from the template."""
    from pathlib import Path

    from engine.plugins import PluginError
    from engine.plugins.scaffold import write_plugin

    try:
        folder = write_plugin(name, kind, Path(directory))
    except PluginError as exc:
        typer.echo(f"error: {exc}", err=True)
        raise typer.Exit(1) from None
    typer.echo(f"wrote {folder}")
    typer.echo(
        f"next: cd {folder} && pip install -e . && pytest tests && engine plugins list; "
        "docs/plugins/writing.md explains each file"
    )
