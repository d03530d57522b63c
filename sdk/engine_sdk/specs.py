"""Registration records that plugin hooks return.

A spec is metadata only: a name, a lazy ``"module:attr"`` target and the capabilities the
plugin declares. The engine reads specs without importing the target, so listing plugins
never imports torch; the target is imported only when the engine picks it.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import ClassVar

__all__ = [
    "AttentionBackendSpec",
    "CLICommandSpec",
    "ModelArchitectureSpec",
    "ModelFormatSpec",
    "PluginSpec",
    "PoolingModelSpec",
    "QuantizationMethodSpec",
    "ReasoningParserSpec",
    "StructuredOutputBackendSpec",
    "ToolParserSpec",
    "SPEC_KINDS",
]


def _check_target(target: str) -> None:
    module, sep, attr = target.partition(":")
    if not sep or not module or not attr:
        raise ValueError(f"target {target!r} must look like 'package.module:Attribute'")


@dataclass(frozen=True)
class PluginSpec:
    """Common fields of every spec.

    ``name`` is what users type (``--tool-call-parser hermes``); ``target`` is the lazy
    ``"module:attr"`` path of the implementation; ``description`` is one line for listings.
    """

    kind: ClassVar[str] = "plugin"
    #: The hook (``engine_sdk.hookspecs``) that returns specs of this kind.
    hook: ClassVar[str] = ""
    #: ``"module:Class"`` every target must subclass; ``None``: any callable.
    base_class: ClassVar[str | None] = None
    name: str
    target: str
    description: str = ""

    def __post_init__(self) -> None:
        if not self.name or not self.name.replace("_", "").replace("-", "").isalnum():
            raise ValueError(f"spec name {self.name!r} must be letters, digits, '-' or '_'")
        _check_target(self.target)

    def capabilities(self) -> dict[str, object]:
        """Declared capabilities shown by ``engine plugins list`` (kind-specific fields)."""
        return {}


@dataclass(frozen=True)
class AttentionBackendSpec(PluginSpec):
    """An attention backend and what it can run; the core checks every field, in one place.

    ``devices``: torch device types (``cpu``, ``cuda``). ``min_capability``: the lowest
    CUDA compute capability times ten (``80`` = Ampere), ``None`` for any. ``dtypes``: model
    dtypes. ``kv_cache_dtypes``: ``--kv-cache-dtype`` values it stores (``auto`` = the model
    dtype). ``block_sizes``: KV-cache block sizes. ``head_sizes``: supported head
    dimensions, empty for any. ``supports_sliding_window``: layers with a sliding window.
    ``supports_logits_soft_cap``: attention-logit soft-capping (Gemma 2 style).
    ``priority`` orders automatic selection among fitting backends (higher wins).
    """

    kind: ClassVar[str] = "attention_backend"
    hook: ClassVar[str] = "register_attention_backends"
    base_class: ClassVar[str | None] = "engine_sdk.interfaces.attention:AttentionBackend"
    devices: tuple[str, ...] = ("cpu", "cuda")
    dtypes: tuple[str, ...] = ("float32", "float16", "bfloat16")
    block_sizes: tuple[int, ...] = (16, 32)
    kv_cache_dtypes: tuple[str, ...] = ("auto",)
    priority: int = 0
    min_capability: int | None = None
    head_sizes: tuple[int, ...] = ()
    supports_sliding_window: bool = True
    supports_logits_soft_cap: bool = False

    def capabilities(self) -> dict[str, object]:
        return {
            "devices": list(self.devices),
            "min_capability": self.min_capability,
            "dtypes": list(self.dtypes),
            "block_sizes": list(self.block_sizes),
            "kv_cache_dtypes": list(self.kv_cache_dtypes),
            "head_sizes": list(self.head_sizes) or "any",
            "supports_sliding_window": self.supports_sliding_window,
            "supports_logits_soft_cap": self.supports_logits_soft_cap,
            "priority": self.priority,
        }


@dataclass(frozen=True)
class ModelArchitectureSpec(PluginSpec):
    """A model architecture; ``architectures`` are the HF ``config.json`` names it serves."""

    kind: ClassVar[str] = "model_architecture"
    hook: ClassVar[str] = "register_model_architectures"
    base_class: ClassVar[str | None] = "engine_sdk.interfaces.model:ModelArchitecture"
    architectures: tuple[str, ...] = ()

    def capabilities(self) -> dict[str, object]:
        return {"architectures": list(self.architectures)}


POOLING_TYPES = ("last", "mean")


@dataclass(frozen=True)
class PoolingModelSpec(PluginSpec):
    """A pooling model (an embedder): a body that returns hidden states, pooled per prompt.

    ``architectures`` are the HF ``config.json`` names it embeds: with ``--task embed``, or
    by default when no ``model_architecture`` serves the name (a bare body such as
    ``Qwen3Model``). ``pooling`` is the default pooling over the prompt's final hidden
    states: ``last`` (the last token's, the Qwen3-Embedding recipe) or ``mean``; a
    checkpoint's sentence-transformers ``1_Pooling/config.json`` or ``--pooling-type``
    overrides it. ``normalize``: embeddings are L2-normalized by default.
    """

    kind: ClassVar[str] = "pooling_model"
    hook: ClassVar[str] = "register_pooling_models"
    base_class: ClassVar[str | None] = "engine_sdk.interfaces.pooling:PoolingModel"
    architectures: tuple[str, ...] = ()
    pooling: str = "last"
    normalize: bool = True

    def __post_init__(self) -> None:
        super().__post_init__()
        if self.pooling not in POOLING_TYPES:
            raise ValueError(
                f"pooling {self.pooling!r} of {self.name!r} must be one of {POOLING_TYPES}"
            )

    def capabilities(self) -> dict[str, object]:
        return {
            "architectures": list(self.architectures),
            "pooling": self.pooling,
            "normalize": self.normalize,
        }


@dataclass(frozen=True)
class QuantizationMethodSpec(PluginSpec):
    """A quantization method; the target is its ``QuantizationConfig`` subclass.

    ``name`` matches a checkpoint's ``quantization_config.quant_method``. ``devices`` and
    ``min_capability`` (CUDA compute capability times ten, e.g. 89) say what hardware the
    fast path needs; ``reference_devices`` can run a slower reference path.
    """

    kind: ClassVar[str] = "quantization_method"
    hook: ClassVar[str] = "register_quantization_methods"
    base_class: ClassVar[str | None] = "engine_sdk.interfaces.quantization:QuantizationConfig"
    devices: tuple[str, ...] = ("cuda",)
    min_capability: int | None = None
    reference_devices: tuple[str, ...] = ("cpu",)

    def capabilities(self) -> dict[str, object]:
        return {
            "devices": list(self.devices),
            "min_capability": self.min_capability,
            "reference_devices": list(self.reference_devices),
        }


@dataclass(frozen=True)
class ToolParserSpec(PluginSpec):
    """A tool-call parser (``--tool-call-parser NAME``); the target is a ``ToolParser``."""

    kind: ClassVar[str] = "tool_parser"
    hook: ClassVar[str] = "register_tool_parsers"
    base_class: ClassVar[str | None] = "engine_sdk.interfaces.tool_parser:ToolParser"


@dataclass(frozen=True)
class ReasoningParserSpec(PluginSpec):
    """A reasoning parser (``--reasoning-parser NAME``); the target is a ``ReasoningParser``."""

    kind: ClassVar[str] = "reasoning_parser"
    hook: ClassVar[str] = "register_reasoning_parsers"
    base_class: ClassVar[str | None] = "engine_sdk.interfaces.reasoning_parser:ReasoningParser"


@dataclass(frozen=True)
class ModelFormatSpec(PluginSpec):
    """A checkpoint format loader (for example GGUF).

    ``suffixes`` are file endings the loader claims (``.gguf``); the target is a
    ``ModelFormat`` subclass that turns the file into config, tokenizer and weights.
    """

    kind: ClassVar[str] = "model_format"
    hook: ClassVar[str] = "register_model_formats"
    base_class: ClassVar[str | None] = "engine_sdk.interfaces.model_format:ModelFormat"
    suffixes: tuple[str, ...] = ()

    def capabilities(self) -> dict[str, object]:
        return {"suffixes": list(self.suffixes)}


@dataclass(frozen=True)
class StructuredOutputBackendSpec(PluginSpec):
    """A grammar backend for structured outputs; the target is a ``StructuredOutputBackend``."""

    kind: ClassVar[str] = "structured_output_backend"
    hook: ClassVar[str] = "register_structured_output_backends"
    base_class: ClassVar[str | None] = (
        "engine_sdk.interfaces.structured_output:StructuredOutputBackend"
    )
    priority: int = 0

    def capabilities(self) -> dict[str, object]:
        return {"priority": self.priority}


@dataclass(frozen=True)
class CLICommandSpec(PluginSpec):
    """An ``engine`` sub-command; the target is a ``typer.Typer`` app or a plain function."""

    kind: ClassVar[str] = "cli_command"
    hook: ClassVar[str] = "register_cli_commands"
    base_class: ClassVar[str | None] = None
    help: str = field(default="")


# The one table of plugin kinds: kind -> spec class (which names its hook and base class).
SPEC_KINDS: dict[str, type[PluginSpec]] = {
    cls.kind: cls
    for cls in (
        AttentionBackendSpec,
        ModelArchitectureSpec,
        PoolingModelSpec,
        QuantizationMethodSpec,
        ToolParserSpec,
        ReasoningParserSpec,
        ModelFormatSpec,
        StructuredOutputBackendSpec,
        CLICommandSpec,
    )
}
