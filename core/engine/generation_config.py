"""Sampling defaults: the model's generation_config.json, overrides, and request merging.

``--generation-config auto`` takes the sampling fields the model ships in
generation_config.json; ``vllm`` uses neutral defaults (the ``SamplingParams`` field
defaults); any other value is a folder holding a generation_config.json.
``--override-generation-config '{"temperature": 0.2}'`` wins over both. A request field
that the caller sets wins over every default.
"""

from __future__ import annotations

import json
import os
from collections.abc import Mapping
from dataclasses import fields
from typing import Any

from engine.sampling_params import SamplingParams

# generation_config.json key -> SamplingParams field
_HF_TO_SAMPLING = {
    "temperature": "temperature",
    "top_p": "top_p",
    "top_k": "top_k",
    "min_p": "min_p",
    "repetition_penalty": "repetition_penalty",
    "max_new_tokens": "max_tokens",
}
_SAMPLING_FIELDS = {f.name for f in fields(SamplingParams)}


def read_generation_config_file(folder: str) -> dict[str, Any]:
    """The raw generation_config.json of ``folder`` ({} when the folder has none)."""
    path = os.path.join(folder, "generation_config.json")
    if not os.path.isfile(path):
        if not os.path.isdir(folder):
            raise ValueError(
                f"--generation-config {folder!r} is not auto, vllm or an existing folder"
            )
        return {}
    with open(path, encoding="utf-8") as f:
        data = json.load(f)
    if not isinstance(data, dict):
        raise ValueError(f"{path} must hold a JSON object")
    return data


def sampling_defaults_from_hf(generation_config: Mapping[str, Any]) -> dict[str, Any]:
    """SamplingParams defaults from a generation_config dict (only the keys it sets)."""
    out: dict[str, Any] = {}
    for hf_key, field_name in _HF_TO_SAMPLING.items():
        value = generation_config.get(hf_key)
        if value is not None:
            out[field_name] = value
    return out


def resolve_sampling_defaults(
    mode: str,
    model_generation_config: Mapping[str, Any],
    override: Mapping[str, Any] | None = None,
) -> dict[str, Any]:
    """Defaults for request fields, as SamplingParams keyword arguments.

    ``mode`` is ``--generation-config``; ``model_generation_config`` the model's own
    generation_config.json (``ModelSource.generation_config()``).
    """
    if mode == "auto":
        defaults = sampling_defaults_from_hf(model_generation_config)
    elif mode == "vllm":
        defaults = {}
    else:
        defaults = sampling_defaults_from_hf(read_generation_config_file(mode))
    for key, value in (override or {}).items():
        name = _HF_TO_SAMPLING.get(key, key)
        if name not in _SAMPLING_FIELDS or name in ("eos_token_ids", "n"):
            allowed = sorted((_SAMPLING_FIELDS - {"eos_token_ids", "n"}) | {"max_new_tokens"})
            raise ValueError(
                f"--override-generation-config key {key!r} is not a sampling field; "
                f"use one of {', '.join(allowed)}"
            )
        defaults[name] = value
    return defaults


def sampling_default_sources(
    mode: str, model_generation_config: Mapping[str, Any], override: Mapping[str, Any] | None
) -> dict[str, str]:
    """Where each default of ``resolve_sampling_defaults`` comes from (field -> source)."""
    if mode == "auto":
        origin, found = "the model's generation_config", model_generation_config
    elif mode == "vllm":
        origin, found = "", {}
    else:
        origin, found = f"--generation-config {mode}", read_generation_config_file(mode)
    sources = {name: origin for name in sampling_defaults_from_hf(found)}
    for key in override or {}:
        sources[_HF_TO_SAMPLING.get(key, key)] = "--override-generation-config"
    return sources


def describe_sampling_defaults(defaults: Mapping[str, Any], sources: Mapping[str, str]) -> str:
    """One line for the startup log: each default that is set and where it came from, then
    the fields left at the neutral defaults."""
    shown = [f"{name}={defaults[name]!r} ({sources.get(name, '?')})" for name in sorted(defaults)]
    neutral = [n for n in ("temperature", "top_p", "top_k", "min_p") if n not in defaults]
    if neutral:
        shown.append(f"{', '.join(neutral)}: neutral (SamplingParams defaults)")
    return "; ".join(shown)


def merge_sampling_params(
    defaults: Mapping[str, Any], request_fields: Mapping[str, Any]
) -> SamplingParams:
    """SamplingParams from the request's set fields over the defaults.

    A field counts as unset when it is missing from ``request_fields`` or ``None``
    (the server passes the fields the client sent). Unknown names raise ``ValueError``.
    An unset ``max_tokens`` with no default stays ``None``: the engine then allows as many
    tokens as fit in the context (``max_model_len - prompt tokens``), as the OpenAI API does.
    """
    unknown = [k for k in request_fields if k not in _SAMPLING_FIELDS]
    if unknown:
        raise ValueError(f"unknown sampling field(s): {', '.join(sorted(unknown))}")
    kwargs: dict[str, Any] = {"max_tokens": None, **defaults}
    kwargs.update({k: v for k, v in request_fields.items() if v is not None})
    return SamplingParams(**kwargs)
