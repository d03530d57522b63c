"""Choosing an attention backend: the fitting backends in order, and why the others refuse.

The checks themselves are :mod:`engine.plugins.capabilities`; this module only ranks, so
the choice is made once, by :meth:`PluginManager.select_attention_backend`.
"""

from __future__ import annotations

from engine_sdk.specs import AttentionBackendSpec

from engine.plugins.capabilities import AttentionNeeds, attention_refusals

__all__ = ["rank_backends"]


def rank_backends(
    specs: list[AttentionBackendSpec], needs: AttentionNeeds
) -> tuple[list[AttentionBackendSpec], dict[str, list[str]]]:
    """Fitting specs (highest priority first, then by name) and ``{name: reasons}``."""
    fitting: list[AttentionBackendSpec] = []
    rejected: dict[str, list[str]] = {}
    for spec in specs:
        reasons = attention_refusals(spec, needs)
        if reasons:
            rejected[spec.name] = reasons
        else:
            fitting.append(spec)
    fitting.sort(key=lambda s: (-s.priority, s.name))
    return fitting, rejected


def refusals_text(rejected: dict[str, list[str]]) -> str:
    """One line per refused backend: ``  - triton: device 'cpu' not in ['cuda']; ...``."""
    return "\n".join(f"  - {name}: {'; '.join(reasons)}" for name, reasons in rejected.items())
