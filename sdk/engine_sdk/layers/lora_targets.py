"""Which layers a LoRA adapter can target in a model (``lora.lora_target_layers``), apart
from ``lora.py``'s slots and kernels: the engine asks it once, when it sets the slots up."""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch

if TYPE_CHECKING:
    from engine_sdk.layers.linear import Linear

__all__ = ["lora_target_layers"]


def lora_target_layers(model: torch.nn.Module) -> dict[str, Linear]:
    """The ``Linear`` layers that run in ``model``'s forward, by HF module name.

    A merged projection (``merge_linears``) runs instead of its parts, so the parts are
    left out and the merged layer is listed under each part's name (its slices)::

        q_proj, k_proj, v_proj merged  ->  {"...q_proj": qkv, "...k_proj": qkv, "...v_proj": qkv}
    """
    from engine_sdk.layers.linear import Linear

    layers = [m for m in model.modules() if isinstance(m, Linear)]
    targets: dict[str, Linear] = {}
    for layer in layers:
        if len(layer.parts) > 1:
            for name, _ in layer.parts:
                targets[name] = layer
    for layer in layers:
        if len(layer.parts) == 1 and layer.prefix not in targets:
            targets[layer.prefix] = layer
    return targets
