# mypy: disable-error-code="empty-body"
"""Every hook a plugin can implement: the one source of truth for the plugin contract.

Each hook is called once when the engine loads plugins and returns a list of spec records
(see ``engine_sdk.specs``). Hooks must be cheap and must not import torch: they describe
what the plugin provides; the engine imports a spec's target only when it uses it.

Every docstring follows one template: a summary line, then ``When called:``, ``Returns:``,
``Conflicts:`` and ``Since:`` (tests/foundation/test_hooks_doc.py checks it). A deprecated
hook adds ``warn_on_impl=deprecated_hook_warning(...)`` (``engine_sdk.deprecation``).
"""

from __future__ import annotations

from engine_sdk._markers import hookspec
from engine_sdk.specs import (
    SPEC_KINDS,
    AttentionBackendSpec,
    CLICommandSpec,
    ModelArchitectureSpec,
    ModelFormatSpec,
    PoolingModelSpec,
    QuantizationMethodSpec,
    ReasoningParserSpec,
    StructuredOutputBackendSpec,
    ToolParserSpec,
)

__all__ = [
    "HOOK_NAMES",
    "register_attention_backends",
    "register_cli_commands",
    "register_model_architectures",
    "register_model_formats",
    "register_quantization_methods",
    "register_reasoning_parsers",
    "register_structured_output_backends",
    "register_tool_parsers",
]


@hookspec
def register_attention_backends() -> list[AttentionBackendSpec]:
    """Return the attention backends this plugin provides.

    When called: once per plugin when the engine loads plugins, before any model loads.
    Returns: a list of ``AttentionBackendSpec``; each target is an
    ``engine_sdk.interfaces.attention.AttentionBackend`` subclass. The core checks every
    declared capability (devices, ``min_capability``, dtypes, KV-cache dtypes, block sizes,
    head sizes, sliding window, soft-cap) and picks the highest ``priority`` backend that
    fits, unless the user names one with ``--attention-backend``.
    Conflicts: a backend name registered by two plugins is an error naming both.
    Since: engine-sdk 0.1.0 (capability fields beyond devices/dtypes/block sizes: 0.1.1).
    """


@hookspec
def register_model_architectures() -> list[ModelArchitectureSpec]:
    """Return the model architectures this plugin provides.

    When called: once per plugin when the engine loads plugins.
    Returns: a list of ``ModelArchitectureSpec``; each target is an
    ``engine_sdk.interfaces.model.ModelArchitecture`` subclass, and the spec's
    ``architectures`` lists the ``config.json`` ``architectures`` names it serves (the one
    place they are declared).
    Conflicts: a spec name, or an HF architecture name, registered by two plugins is an
    error naming both.
    Since: engine-sdk 0.1.0.
    """


@hookspec
def register_pooling_models() -> list[PoolingModelSpec]:
    """Return the pooling models (embedders) this plugin provides.

    When called: once per plugin when the engine loads plugins.
    Returns: a list of ``PoolingModelSpec``; each target is an
    ``engine_sdk.interfaces.pooling.PoolingModel`` subclass; the spec's ``architectures``
    lists the ``config.json`` names it embeds (with ``--task embed``, or by default for a
    name no ``model_architecture`` serves) and its default ``pooling``.
    Conflicts: two plugins embedding the same architecture name is an error naming both.
    Since: engine-sdk 0.1.1.
    """


@hookspec
def register_quantization_methods() -> list[QuantizationMethodSpec]:
    """Return the quantization methods this plugin provides.

    When called: once per plugin when the engine loads plugins; a checkpoint whose
    ``quant_method`` names a not-yet-loaded provider loads that plugin on demand.
    Returns: a list of ``QuantizationMethodSpec``; each target is an
    ``engine_sdk.interfaces.quantization.QuantizationConfig`` subclass, selected by a
    checkpoint's ``quant_method`` or by ``--quantization NAME``. The core refuses a device
    outside ``devices``/``reference_devices`` or below ``min_capability``.
    Conflicts: a method name registered by two plugins is an error naming both.
    Since: engine-sdk 0.1.0.
    """


@hookspec
def register_tool_parsers() -> list[ToolParserSpec]:
    """Return the tool-call parsers this plugin provides.

    When called: once per plugin when the engine loads plugins.
    Returns: a list of ``ToolParserSpec``; each target is an
    ``engine_sdk.interfaces.tool_parser.ToolParser`` subclass, selected with
    ``--tool-call-parser NAME``.
    Conflicts: a parser name registered twice (by two plugins, or by a plugin and a
    ``--tool-parser-plugin`` file) is an error naming both.
    Since: engine-sdk 0.1.0.
    """


@hookspec
def register_reasoning_parsers() -> list[ReasoningParserSpec]:
    """Return the reasoning parsers this plugin provides.

    When called: once per plugin when the engine loads plugins.
    Returns: a list of ``ReasoningParserSpec``; each target is an
    ``engine_sdk.interfaces.reasoning_parser.ReasoningParser`` subclass, selected with
    ``--reasoning-parser NAME``.
    Conflicts: a parser name registered by two plugins is an error naming both.
    Since: engine-sdk 0.1.0.
    """


@hookspec
def register_model_formats() -> list[ModelFormatSpec]:
    """Return the checkpoint formats this plugin can load (for example GGUF).

    When called: once per plugin when the engine loads plugins.
    Returns: a list of ``ModelFormatSpec``; each target is an
    ``engine_sdk.interfaces.model_format.ModelFormat`` subclass. Before falling back to
    the Hugging Face folder layout the engine asks each format whose ``suffixes`` match the
    ``--model`` path (a file with one, or a folder holding one; no suffixes: every path)
    whether it claims it.
    Conflicts: a format name registered by two plugins is an error naming both; the first
    format that claims a path reads it.
    Since: engine-sdk 0.1.0.
    """


@hookspec
def register_structured_output_backends() -> list[StructuredOutputBackendSpec]:
    """Return the grammar backends for structured outputs this plugin provides.

    When called: once per plugin when the engine loads plugins.
    Returns: a list of ``StructuredOutputBackendSpec``; each target is an
    ``engine_sdk.interfaces.structured_output.StructuredOutputBackend`` subclass, selected
    with ``--structured-outputs-config.backend NAME`` (``auto`` picks the highest
    ``priority``). The backend instance and its compiled grammars must pickle: the engine
    compiles in worker processes (killed past a deadline, capped in memory).
    Conflicts: a backend name registered by two plugins is an error naming both.
    Since: engine-sdk 0.1.0.
    """


@hookspec
def register_cli_commands() -> list[CLICommandSpec]:
    """Return extra ``engine`` sub-commands.

    When called: once per plugin each time the ``engine`` CLI starts.
    Returns: a list of ``CLICommandSpec``; each target is a ``typer.Typer`` app (mounted as
    a command group) or a function (mounted as one command) named ``engine <name>``.
    Conflicts: a command name registered by two plugins is an error naming both; a
    built-in command's name is never replaced.
    Since: engine-sdk 0.1.0.
    """


# Every hook, in the order of the kinds table (``engine_sdk.specs.SPEC_KINDS``).
HOOK_NAMES: tuple[str, ...] = tuple(spec.hook for spec in SPEC_KINDS.values())
