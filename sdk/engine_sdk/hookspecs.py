# mypy: disable-error-code="empty-body"
"""Every hook a plugin can implement: the one source of truth for the plugin contract.

Each hook is called once when the engine loads plugins and returns a list of spec records
(see ``engine_sdk.specs``). Hooks must be cheap and must not import torch: they describe
what the plugin provides; the engine imports a spec's target only when it uses it.
"""

from __future__ import annotations

from engine_sdk._markers import hookspec
from engine_sdk.specs import (
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


@hookspec
def register_attention_backends() -> list[AttentionBackendSpec]:
    """Return the attention backends this plugin provides.

    Each target is an ``engine_sdk.interfaces.attention.AttentionBackend`` subclass. The
    engine picks the highest ``priority`` backend whose ``devices``, ``dtypes`` and
    ``block_sizes`` fit the run, unless the user names one with ``--attention-backend``.
    """


@hookspec
def register_model_architectures() -> list[ModelArchitectureSpec]:
    """Return the model architectures this plugin provides.

    Each target is an ``engine_sdk.interfaces.model.ModelArchitecture`` subclass; the
    spec's ``architectures`` lists the ``config.json`` ``architectures`` names it serves.
    Two plugins serving the same architecture name is an error.
    """


@hookspec
def register_pooling_models() -> list[PoolingModelSpec]:
    """Return the pooling models (embedders) this plugin provides.

    Each target is an ``engine_sdk.interfaces.pooling.PoolingModel`` subclass; the spec's
    ``architectures`` lists the ``config.json`` names it embeds (with ``--task embed``, or
    by default for a name no ``model_architecture`` serves) and its default ``pooling``.
    Two plugins embedding the same architecture name is an error.
    """


@hookspec
def register_quantization_methods() -> list[QuantizationMethodSpec]:
    """Return the quantization methods this plugin provides.

    Each target is an ``engine_sdk.interfaces.quantization.QuantizationConfig`` subclass,
    selected by a checkpoint's ``quant_method`` or by ``--quantization NAME``.
    """


@hookspec
def register_tool_parsers() -> list[ToolParserSpec]:
    """Return the tool-call parsers this plugin provides.

    Each target is an ``engine_sdk.interfaces.tool_parser.ToolParser`` subclass, selected
    with ``--tool-call-parser NAME``.
    """


@hookspec
def register_reasoning_parsers() -> list[ReasoningParserSpec]:
    """Return the reasoning parsers this plugin provides.

    Each target is an ``engine_sdk.interfaces.reasoning_parser.ReasoningParser``
    subclass, selected with ``--reasoning-parser NAME``.
    """


@hookspec
def register_model_formats() -> list[ModelFormatSpec]:
    """Return the checkpoint formats this plugin can load (for example GGUF).

    Each target is an ``engine_sdk.interfaces.model_format.ModelFormat`` subclass. The
    engine asks each format whether it claims a ``--model`` path before falling back to
    the Hugging Face folder layout.
    """


@hookspec
def register_structured_output_backends() -> list[StructuredOutputBackendSpec]:
    """Return the grammar backends for structured outputs this plugin provides.

    Each target is an ``engine_sdk.interfaces.structured_output.StructuredOutputBackend``
    subclass, selected with ``--structured-outputs-config.backend NAME`` (``auto`` picks
    the highest ``priority``).
    """


@hookspec
def register_cli_commands() -> list[CLICommandSpec]:
    """Return extra ``engine`` sub-commands.

    Each target is a ``typer.Typer`` app (mounted as a command group) or a function
    (mounted as one command) named ``engine <name>``.
    """


HOOK_NAMES: tuple[str, ...] = (
    "register_attention_backends",
    "register_model_architectures",
    "register_pooling_models",
    "register_quantization_methods",
    "register_tool_parsers",
    "register_reasoning_parsers",
    "register_model_formats",
    "register_structured_output_backends",
    "register_cli_commands",
)
