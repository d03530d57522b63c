"""``engine plugins list --explain``: which backends and methods fit this run, and why not.

The same checks and the same reasons as the startup error (``engine.plugins.capabilities``):
for each attention backend and quantization method, "fits" or every reason it refuses.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import typer

from engine.plugins.capabilities import (
    AttentionNeeds,
    QuantizationNeeds,
    attention_refusals,
    quantization_refusals,
)

if TYPE_CHECKING:
    from engine.plugins import PluginManager

__all__ = ["detect_device", "explain", "print_explain"]


def detect_device(device: str) -> tuple[str, int | None]:
    """``auto`` -> ``cuda`` when a GPU is visible, else ``cpu``; with its capability."""
    try:
        import torch
    except ImportError:
        return ("cpu" if device == "auto" else device), None
    if device == "auto":
        device = "cuda" if torch.cuda.is_available() else "cpu"
    if device.startswith("cuda") and torch.cuda.is_available():
        major, minor = torch.cuda.get_device_capability(device)
        return device, major * 10 + minor
    return device, None


def explain(
    pm: PluginManager, needs: AttentionNeeds, quant_needs: QuantizationNeeds
) -> dict[str, Any]:
    """``{"needs": ..., kind: {name: {"fits": bool, "reasons": [...]}}}``."""
    attention = {
        spec.name: attention_refusals(spec, needs)
        for spec in sorted(pm.attention_specs(), key=lambda s: (-s.priority, s.name))
    }
    quantization = {
        spec.name: quantization_refusals(spec, quant_needs) for spec in pm.quantization_specs()
    }
    return {
        "needs": needs.describe(),
        "attention_backend": {n: {"fits": not r, "reasons": r} for n, r in attention.items()},
        "quantization_method": {n: {"fits": not r, "reasons": r} for n, r in quantization.items()},
    }


def print_explain(report: dict[str, Any]) -> None:
    typer.echo(f"for {report['needs']}:")
    for kind in ("attention_backend", "quantization_method"):
        typer.echo(f"{kind}:")
        entries = report[kind]
        if not entries:
            typer.echo("  (none loaded)")
        for name, verdict in entries.items():
            if verdict["fits"]:
                typer.echo(f"  {name}: fits")
                continue
            typer.echo(f"  {name}: refused")
            for reason in verdict["reasons"]:
                typer.echo(f"    - {reason}")
