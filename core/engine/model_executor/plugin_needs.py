"""What this run needs from its plugins, read from the flags, the device and the model.

The checks and the choice are the plugin manager's (``engine.plugins.capabilities`` and
``PluginManager.select_attention_backend``); this module gathers the facts they need:
device and its compute capability, dtype, block size, ``--kv-cache-dtype``, the model's
head size, and whether it uses a sliding window or soft-capped attention logits.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import torch

from engine.errors import StartupError
from engine.plugins.capabilities import AttentionNeeds, QuantizationNeeds

if TYPE_CHECKING:
    from engine_sdk.interfaces.attention import AttentionBackend

    from engine.config import EngineArgs
    from engine.plugins import PluginManager

__all__ = [
    "attention_needs",
    "choose_attention_backend",
    "device_capability",
    "quantization_needs",
]


def device_capability(device: torch.device) -> int | None:
    """The CUDA compute capability times ten (``80`` for an A100); ``None`` off CUDA."""
    if device.type != "cuda" or not torch.cuda.is_available():
        return None
    major, minor = torch.cuda.get_device_capability(device)
    return major * 10 + minor


def _head_size(hf_config: Any) -> int | None:
    head_dim = getattr(hf_config, "head_dim", None)
    if head_dim:
        return int(head_dim)
    hidden = getattr(hf_config, "hidden_size", None)
    heads = getattr(hf_config, "num_attention_heads", None)
    if isinstance(hidden, int) and isinstance(heads, int) and heads > 0:
        return hidden // heads
    return None


def attention_needs(
    args: EngineArgs, device: torch.device, dtype: torch.dtype, block_size: int, hf_config: Any
) -> AttentionNeeds:
    """The run's needs; a config without a sliding window or soft-cap field needs neither."""
    return AttentionNeeds(
        device=device.type,
        dtype=str(dtype),
        block_size=block_size,
        kv_cache_dtype=args.kv_cache_dtype,
        capability=device_capability(device),
        head_size=_head_size(hf_config),
        sliding_window=bool(getattr(hf_config, "sliding_window", None)),
        logits_soft_cap=bool(getattr(hf_config, "attn_logit_softcapping", None)),
    )


def quantization_needs(device: torch.device, allow_reference: bool = False) -> QuantizationNeeds:
    """The device type and capability a quantization method's spec is checked against."""
    return QuantizationNeeds(
        device=device.type, capability=device_capability(device), allow_reference=allow_reference
    )


def choose_attention_backend(
    pm: PluginManager, args: EngineArgs, needs: AttentionNeeds
) -> type[AttentionBackend]:
    """``--attention-backend`` if it fits, else the best fitting one; ``StartupError``
    listing every backend's reasons when none does."""
    try:
        return pm.select_attention_backend(needs, args.attention_backend)
    except Exception as exc:  # PluginError, or a backend whose code does not import
        raise StartupError(str(exc)) from exc
