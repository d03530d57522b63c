"""Which task a checkpoint runs (generate or embed) and, for embed, how it pools.

``--task embed`` embeds with the pooling model (``register_pooling_models``) serving the
checkpoint's architecture; ``--task auto`` does so only when no generating architecture
serves it (a bare body such as ``Qwen3Model``). The pooling type is ``--pooling-type``,
else the checkpoint's sentence-transformers ``1_Pooling/config.json``, else the pooling
model's default. Matryoshka truncation (the ``dimensions`` request field) is allowed when
the config declares ``matryoshka_dimensions`` (those sizes) or ``is_matryoshka`` (any).
The engine and every front end call ``resolve_pooling`` on the same inputs, so they agree.
"""

from __future__ import annotations

import json
import logging
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from engine_sdk.specs import POOLING_TYPES

from engine.errors import StartupError

logger = logging.getLogger(__name__)
TASKS = ("auto", "generate", "embed")
_ST_POOLING_KEYS = {"pooling_mode_lasttoken": "last", "pooling_mode_mean_tokens": "mean"}


@dataclass(frozen=True)
class PoolingConfig:
    """How an embedding model turns a prompt into its vector."""

    model_name: str  # the pooling_model spec name
    pooling: str  # "last" or "mean"
    normalize: bool
    embedding_size: int
    # None: no truncation allowed; () any size up to embedding_size; else these sizes.
    matryoshka_dimensions: tuple[int, ...] | None = None


def resolve_pooling(args: Any, pm: Any, hf_config: Any, model_path: Any) -> PoolingConfig | None:
    """The pooling configuration when the task is embed, ``None`` for generate."""
    task = getattr(args, "task", "auto")
    if task not in TASKS:
        raise StartupError(f"--task {task!r} is not known; use one of {', '.join(TASKS)}")
    if task == "generate":
        return None
    architectures = list(getattr(hf_config, "architectures", None) or [])
    arch = architectures[0] if architectures else ""
    found = pm.registry.pooling_architecture(arch)
    if task == "auto":
        if found is None or pm.registry.architecture(arch) is not None:
            return None
    elif found is None:
        known = ", ".join(pm.registry.pooling_architectures()) or "none"
        raise StartupError(
            f"--task embed: no loaded plugin embeds the architecture {arch!r}; pooling "
            f"models serve: {known}. Use --task generate, or install a pooling model plugin"
        )
    spec = found[0]
    pooling = args.pooling_type or _sentence_transformers_pooling(model_path) or spec.pooling
    if pooling not in POOLING_TYPES:
        raise StartupError(
            f"--pooling-type {pooling!r} is not supported; use one of {', '.join(POOLING_TYPES)}"
        )
    config = PoolingConfig(
        model_name=spec.name,
        pooling=pooling,
        normalize=spec.normalize,
        embedding_size=int(hf_config.hidden_size),
        matryoshka_dimensions=_matryoshka(hf_config),
    )
    return config


def _sentence_transformers_pooling(model_path: Any) -> str | None:
    if model_path is None:
        return None
    path = Path(str(model_path)) / "1_Pooling" / "config.json"
    if not path.is_file():
        return None
    try:
        data = json.loads(path.read_text())
    except (OSError, json.JSONDecodeError):
        logger.warning("ignoring unreadable %s", path)
        return None
    for key, pooling in _ST_POOLING_KEYS.items():
        if data.get(key):
            return pooling
    return None


def _matryoshka(hf_config: Any) -> tuple[int, ...] | None:
    dims = getattr(hf_config, "matryoshka_dimensions", None)
    if dims:
        return tuple(int(d) for d in dims)
    if getattr(hf_config, "is_matryoshka", False):
        return ()
    return None


def pooling_model_class(pm: Any, pooling: PoolingConfig) -> Any:
    """The ``PoolingModel`` subclass of ``pooling`` (imported on first use)."""
    try:
        return pm.registry.resolve("pooling_model", pooling.model_name)
    except Exception as exc:
        raise StartupError(str(exc)) from exc
