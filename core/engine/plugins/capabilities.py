"""The one place the core checks declared capabilities against what a run needs.

A spec declares what its plugin can do (``engine_sdk.specs``); :class:`AttentionNeeds` and
:class:`QuantizationNeeds` say what this run asks for. Each ``*_refusals`` function returns
every reason a spec cannot serve the run (empty: it can), so the startup error and
``engine plugins list --explain`` show the same list. Nothing here imports a target.
"""

from __future__ import annotations

from dataclasses import dataclass

from engine_sdk.specs import AttentionBackendSpec, QuantizationMethodSpec

__all__ = [
    "AttentionNeeds",
    "QuantizationNeeds",
    "attention_refusals",
    "capability_text",
    "normalize_device",
    "normalize_dtype",
    "quantization_refusals",
]

# --kv-cache-dtype values that name the same storage.
_KV_ALIASES = {"fp8": "fp8_e4m3", "fp8_e4m3": "fp8"}


def normalize_device(device: object) -> str:
    """``"cuda:0"`` / ``torch.device("cuda", 0)`` -> ``"cuda"``."""
    return str(device).split(":")[0].strip().lower()


def normalize_dtype(dtype: object) -> str:
    """``torch.float16`` / ``"torch.float16"`` / ``"float16"`` -> ``"float16"``."""
    text = str(dtype).strip().lower()
    text = text.removeprefix("torch.")
    return {"half": "float16", "float": "float32", "bf16": "bfloat16", "fp16": "float16"}.get(
        text, text
    )


def capability_text(capability: int) -> str:
    """``89`` -> ``"8.9"`` (compute capabilities are declared times ten)."""
    return f"{capability // 10}.{capability % 10}"


@dataclass(frozen=True)
class AttentionNeeds:
    """What a run asks of its attention backend.

    ``capability``: the CUDA compute capability times ten (``None`` off CUDA or unknown).
    ``head_size``: the model's head dimension (``None``: not checked).
    ``sliding_window`` / ``logits_soft_cap``: whether any layer uses one.
    """

    device: str
    dtype: str
    block_size: int
    kv_cache_dtype: str = "auto"
    capability: int | None = None
    head_size: int | None = None
    sliding_window: bool = False
    logits_soft_cap: bool = False

    def __post_init__(self) -> None:
        object.__setattr__(self, "device", normalize_device(self.device))
        object.__setattr__(self, "dtype", normalize_dtype(self.dtype))

    def describe(self) -> str:
        """``device=cuda (capability 8.0), dtype=bfloat16, block_size=16, ...``."""
        device = self.device
        if self.capability is not None:
            device += f" (capability {capability_text(self.capability)})"
        parts = [f"device={device}", f"dtype={self.dtype}", f"block_size={self.block_size}"]
        if self.kv_cache_dtype != "auto":
            parts.append(f"kv_cache_dtype={self.kv_cache_dtype}")
        if self.head_size is not None:
            parts.append(f"head_size={self.head_size}")
        if self.sliding_window:
            parts.append("sliding window")
        if self.logits_soft_cap:
            parts.append("logit soft-cap")
        return ", ".join(parts)


def stores_kv_cache_dtype(spec: AttentionBackendSpec, kv_cache_dtype: str) -> bool:
    """Whether the backend declares ``kv_cache_dtype`` (``fp8`` and ``fp8_e4m3`` are one)."""
    declared = set(spec.kv_cache_dtypes)
    return kv_cache_dtype in declared or _KV_ALIASES.get(kv_cache_dtype) in declared


def attention_refusals(spec: AttentionBackendSpec, needs: AttentionNeeds) -> list[str]:
    """Every reason ``spec`` cannot serve ``needs``; empty when it can."""
    reasons: list[str] = []
    if needs.device not in spec.devices:
        reasons.append(f"device {needs.device!r} not in {list(spec.devices)}")
    elif (
        needs.device == "cuda"
        and spec.min_capability is not None
        and needs.capability is not None
        and needs.capability < spec.min_capability
    ):
        reasons.append(
            f"needs compute capability >= {capability_text(spec.min_capability)}, this GPU "
            f"is {capability_text(needs.capability)}"
        )
    if needs.dtype not in spec.dtypes:
        reasons.append(f"dtype {needs.dtype!r} not in {list(spec.dtypes)}")
    if not stores_kv_cache_dtype(spec, needs.kv_cache_dtype):
        reasons.append(
            f"kv_cache_dtype {needs.kv_cache_dtype!r} not in {list(spec.kv_cache_dtypes)}"
        )
    if needs.block_size not in spec.block_sizes:
        reasons.append(f"block size {needs.block_size} not in {list(spec.block_sizes)}")
    if needs.head_size is not None and spec.head_sizes and needs.head_size not in spec.head_sizes:
        reasons.append(f"head size {needs.head_size} not in {list(spec.head_sizes)}")
    if needs.sliding_window and not spec.supports_sliding_window:
        reasons.append("the model uses a sliding window, which it does not support")
    if needs.logits_soft_cap and not spec.supports_logits_soft_cap:
        reasons.append("the model soft-caps attention logits, which it does not support")
    return reasons


@dataclass(frozen=True)
class QuantizationNeeds:
    """What a run asks of a quantization method: the device type and its capability.

    ``allow_reference``: the checkpoint accepts the slower reference path on a GPU below
    the spec's ``min_capability`` (``QuantizationConfig.allow_reference``).
    """

    device: str
    capability: int | None = None
    allow_reference: bool = False

    def __post_init__(self) -> None:
        object.__setattr__(self, "device", normalize_device(self.device))


def quantization_refusals(spec: QuantizationMethodSpec, needs: QuantizationNeeds) -> list[str]:
    """Every reason ``spec`` cannot run on ``needs``' device; empty when it can.

    A device in ``reference_devices`` always runs (the reference path); one in ``devices``
    runs the fast path when its capability reaches ``min_capability``.
    """
    if needs.device in spec.reference_devices:
        return []
    if needs.device not in spec.devices:
        runs_on = list(spec.devices) + list(spec.reference_devices)
        return [f"device {needs.device!r} not in {runs_on}"]
    if (
        needs.device == "cuda"
        and spec.min_capability is not None
        and needs.capability is not None
        and needs.capability < spec.min_capability
        and not needs.allow_reference
    ):
        reference = ", ".join(spec.reference_devices)
        return [
            f"needs compute capability >= {capability_text(spec.min_capability)}, this GPU "
            f"is {capability_text(needs.capability)}"
            + (f" (the reference path runs on: {reference})" if reference else "")
        ]
    return []
