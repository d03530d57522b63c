"""Building the engine's ``StructuredOutputManager`` and reasoning parser from ``EngineArgs``.

``--structured-outputs-config.backend auto`` with no backend installed is not a startup
error: the engine runs, and a request that asks for structured outputs gets a 400 naming
the package to install. A backend named explicitly must exist (``StartupError`` otherwise).
``--reasoning-parser NAME`` must name an installed reasoning parser; the error lists them.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from engine_sdk.interfaces.reasoning_parser import ReasoningParser

from engine.config import EngineArgs
from engine.errors import RequestValidationError, StartupError
from engine.plugins.errors import PluginError
from engine.structured_output.config import StructuredOutputsConfig
from engine.structured_output.manager import StructuredOutputManager

if TYPE_CHECKING:
    from engine.plugins import PluginManager

logger = logging.getLogger(__name__)

NO_BACKEND_HINT = (
    "structured outputs are not available: no structured output backend is installed; "
    "pip install engine-outlines and restart the server"
)


def build_structured_output_manager(
    args: EngineArgs,
    pm: PluginManager,
    tokenizer: Any,
    vocab_size: int,
    eos_token_ids: Sequence[int],
) -> StructuredOutputManager | None:
    """The manager for ``args``; ``None`` when ``auto`` finds no backend installed."""
    backend = args.structured_outputs_backend or "auto"
    if backend == "auto" and not pm.registry.specs("structured_output_backend"):
        logger.info("structured outputs: no backend installed; requests using them get a 400")
        return None
    try:
        config = StructuredOutputsConfig(
            backend=backend,
            max_repeat=args.structured_outputs_max_repeat,
            max_schema_depth=args.structured_outputs_max_schema_depth,
            compile_timeout_s=args.structured_outputs_compile_timeout_s,
            compile_memory_bytes=args.structured_outputs_compile_memory_bytes,
        )
    except ValueError as exc:
        raise StartupError(str(exc)) from None
    try:
        manager = StructuredOutputManager(
            tokenizer, vocab_size, pm, config=config, eos_token_ids=list(eos_token_ids)
        )
    except ValueError as exc:  # no EOS id: structured outputs could never end an output
        raise StartupError(f"structured outputs cannot be used with this model: {exc}") from None
    logger.info("structured outputs: backend %s", manager.backend_name)
    return manager


def require_manager(manager: StructuredOutputManager | None) -> StructuredOutputManager:
    """``manager``, or the 400 saying that no backend is installed."""
    if manager is None:
        raise RequestValidationError(NO_BACKEND_HINT)
    return manager


def resolve_reasoning_parser(pm: PluginManager, name: str | None) -> type[ReasoningParser] | None:
    """The class of ``--reasoning-parser NAME`` (``None`` when unset); ``StartupError``
    listing the installed ones for an unknown name."""
    if not name:
        return None
    installed = pm.registry.names("reasoning_parser")
    if name not in installed:
        raise StartupError(
            f"--reasoning-parser {name!r} is not installed; installed reasoning parsers: "
            f"{', '.join(installed) or 'none (pip install engine-reasoning)'}"
        )
    try:
        parser_cls: type[ReasoningParser] = pm.registry.resolve("reasoning_parser", name)
    except PluginError as exc:
        raise StartupError(f"--reasoning-parser {name!r}: {exc}") from None
    return parser_cls
