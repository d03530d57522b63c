"""Structured outputs: constrain sampling to a JSON schema, regex, choice list or grammar.

The grammar engine is a plugin (``structured_output_backend``; ``engine-outlines`` is the
default). ``StructuredOutputManager`` picks it, compiles constraints in killable,
memory-capped worker processes (``compile_worker.py``) into a bounded in-memory cache, and
turns per-request matchers into the sampler's masks.

Wiring (the API layer, the engine, then the runner)::

    manager = StructuredOutputManager(tokenizer, model_vocab_size, pm,
                                      config=StructuredOutputsConfig(...),
                                      eos_token_ids=collect_eos_token_ids(...))
    # API server, before add_request (cheap checks; a RequestValidationError is a 400):
    manager.validate(params.structured_outputs)
    # engine, before queueing the request (off its loop; the one compile of the grammar):
    future = manager.compile_async(params.structured_outputs)
    # runner, when a constrained request is first scheduled (a cache hit):
    matchers[req_id] = manager.matcher_for(params.structured_outputs, output_token_ids)
    # runner, each step: one entry per logits row (None for unconstrained rows); packed
    # rows of the mask table (mask_table.py), on the logits' device
    batch.allowed_token_masks = manager.packed_masks(
        [matchers.get(r) for r in rows], vocab_size, logits.device)
    # runner, after sampling (rows that produced a token):
    if not manager.accept_token(matchers[req_id], token_id): ...  # finish with an error
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from engine.structured_output.cache import GrammarCache
    from engine.structured_output.compile_worker import (
        CompileAbandoned,
        CompileLimitError,
        CompileWorkerPool,
    )
    from engine.structured_output.config import StructuredOutputsConfig
    from engine.structured_output.deadlines import with_deadline
    from engine.structured_output.keys import GrammarKey, grammar_key
    from engine.structured_output.manager import StructuredOutputManager, select_backend
    from engine.structured_output.masks import EosRules, batch_masks

# Exported names and their modules, imported on first use: a grammar compile worker
# imports ``compile_worker`` from this package and must not load torch (``manager``,
# ``masks``) with it.
_EXPORTS = {
    "CompileAbandoned": "compile_worker",
    "CompileLimitError": "compile_worker",
    "CompileWorkerPool": "compile_worker",
    "EosRules": "masks",
    "GrammarCache": "cache",
    "GrammarKey": "keys",
    "StructuredOutputManager": "manager",
    "StructuredOutputsConfig": "config",
    "batch_masks": "masks",
    "grammar_key": "keys",
    "select_backend": "manager",
    "with_deadline": "deadlines",
}


def __getattr__(name: str) -> Any:
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    return getattr(importlib.import_module(f"{__name__}.{module}"), name)


__all__ = [
    "CompileAbandoned",
    "CompileLimitError",
    "CompileWorkerPool",
    "EosRules",
    "GrammarCache",
    "GrammarKey",
    "StructuredOutputManager",
    "StructuredOutputsConfig",
    "batch_masks",
    "grammar_key",
    "select_backend",
    "with_deadline",
]
