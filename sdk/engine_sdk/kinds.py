"""What each plugin kind is: its hook, its spec type and the base class its targets subclass.

The core's registry and the SDK's conformance suite both check plugins against this one
table. Base classes are lazy ``"module:Class"`` strings so reading the table never imports
torch; :func:`load_base_class` imports one when a target is actually resolved.
"""

from __future__ import annotations

import importlib
from typing import Any

from engine_sdk.specs import SPEC_KINDS, PluginSpec

__all__ = [
    "KIND_BASE_CLASSES",
    "KIND_HOOKS",
    "check_target",
    "import_target",
    "load_base_class",
    "validate_hook_result",
]

# kind -> the hook (in engine_sdk.hookspecs) that returns that kind's specs.
KIND_HOOKS: dict[str, str] = {
    "attention_backend": "register_attention_backends",
    "model_architecture": "register_model_architectures",
    "pooling_model": "register_pooling_models",
    "quantization_method": "register_quantization_methods",
    "tool_parser": "register_tool_parsers",
    "reasoning_parser": "register_reasoning_parsers",
    "model_format": "register_model_formats",
    "structured_output_backend": "register_structured_output_backends",
    "cli_command": "register_cli_commands",
}

# kind -> the base class a spec's target must subclass. ``None``: cli_command targets are a
# ``typer.Typer`` app or a plain function, so they are only checked to be callable.
KIND_BASE_CLASSES: dict[str, str | None] = {
    "attention_backend": "engine_sdk.interfaces.attention:AttentionBackend",
    "model_architecture": "engine_sdk.interfaces.model:ModelArchitecture",
    "pooling_model": "engine_sdk.interfaces.pooling:PoolingModel",
    "quantization_method": "engine_sdk.interfaces.quantization:QuantizationConfig",
    "tool_parser": "engine_sdk.interfaces.tool_parser:ToolParser",
    "reasoning_parser": "engine_sdk.interfaces.reasoning_parser:ReasoningParser",
    "model_format": "engine_sdk.interfaces.model_format:ModelFormat",
    "structured_output_backend": "engine_sdk.interfaces.structured_output:StructuredOutputBackend",
    "cli_command": None,
}

assert set(KIND_HOOKS) == set(SPEC_KINDS) == set(KIND_BASE_CLASSES)


def _check_kind(kind: str) -> None:
    if kind not in SPEC_KINDS:
        known = ", ".join(sorted(SPEC_KINDS))
        raise ValueError(f"unknown plugin kind {kind!r}; use one of: {known}")


def import_target(target: str) -> Any:
    """Import ``"package.module:Attr"`` (``Attr`` may be dotted) and return the attribute."""
    module_name, sep, attr_path = target.partition(":")
    if not sep or not module_name or not attr_path:
        raise ValueError(f"target {target!r} must look like 'package.module:Attribute'")
    obj: Any = importlib.import_module(module_name)
    for attr in attr_path.split("."):
        try:
            obj = getattr(obj, attr)
        except AttributeError:
            raise AttributeError(
                f"module {module_name!r} has no attribute {attr_path!r} (target {target!r}); "
                "fix the spec's target or the module"
            ) from None
    return obj


def load_base_class(kind: str) -> type | None:
    """The base class targets of ``kind`` subclass, or ``None`` for ``cli_command``."""
    _check_kind(kind)
    base = KIND_BASE_CLASSES[kind]
    if base is None:
        return None
    cls = import_target(base)
    assert isinstance(cls, type)
    return cls


def check_target(kind: str, obj: object) -> str | None:
    """Why ``obj`` cannot serve as a target of ``kind``, or ``None`` when it fits."""
    _check_kind(kind)
    base_path = KIND_BASE_CLASSES[kind]
    if base_path is None:
        if callable(obj):
            return None
        return f"a {kind} target must be a typer.Typer app or a function, got {type(obj)!r}"
    base = load_base_class(kind)
    assert base is not None
    if not isinstance(obj, type):
        return f"a {kind} target must be a class subclassing {base_path}, got {obj!r}"
    if not issubclass(obj, base):
        return f"{obj.__module__}.{obj.__qualname__} does not subclass {base_path}"
    return None


def validate_hook_result(kind: str, result: object, plugin_name: str) -> list[PluginSpec]:
    """Check what one plugin's hook returned: a list of ``kind``'s spec type.

    Returns the specs; raises ``TypeError`` naming the plugin, the hook and what to return.
    """
    _check_kind(kind)
    hook = KIND_HOOKS[kind]
    spec_type = SPEC_KINDS[kind]
    if not isinstance(result, (list, tuple)):
        raise TypeError(
            f"plugin {plugin_name!r}: hook {hook}() returned {type(result).__name__}; "
            f"return a list of {spec_type.__name__}"
        )
    for item in result:
        if not isinstance(item, spec_type):
            raise TypeError(
                f"plugin {plugin_name!r}: hook {hook}() returned a {type(item).__name__} "
                f"item ({item!r}); every item must be an engine_sdk.{spec_type.__name__}"
            )
    return list(result)


def spec_kind_of(spec: PluginSpec) -> str:
    """The kind of a spec instance (``spec.kind``), checked against the known kinds."""
    kind: str = spec.kind
    _check_kind(kind)
    return kind
