"""PEFT adapter folders: read and check ``adapter_config.json``, load the LoRA tensors.

A folder holds ``adapter_config.json`` (``r``, ``lora_alpha``, ``target_modules``, ...)
and ``adapter_model.safetensors`` with one pair per targeted module::

    base_model.model.model.layers.0.self_attn.q_proj.lora_A.weight   [r, in]
    base_model.model.model.layers.0.self_attn.q_proj.lora_B.weight   [out, r]

``check_adapter`` validates without loading tensors (the server at startup and on the load
route, the offline ``LLM`` before a request): the folder and files exist, the rank fits
``--max-lora-rank``, the targets are projections the engine serves, and every tensor's
shape fits the served model (an adapter of another base model does not). Each error names
the value, the limit and the flag to change. ``load_adapter`` reads the tensors (the
runner), with the scaling (``lora_alpha / r``, or ``/ sqrt(r)`` with rsLoRA) folded into B.
"""

from __future__ import annotations

import json
import math
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from engine.lora.request import LoRARequest

__all__ = [
    "SUPPORTED_TARGET_MODULES",
    "adapter_modules",
    "check_targets",
    "AdapterConfig",
    "LoRAAdapter",
    "LoRAAdapterError",
    "check_adapter",
    "load_adapter",
    "read_adapter_config",
]

SUPPORTED_TARGET_MODULES = (
    "q_proj", "k_proj", "v_proj", "o_proj", "qkv_proj",
    "gate_proj", "up_proj", "down_proj", "gate_up_proj",
)  # fmt: skip
CONFIG_FILE = "adapter_config.json"
WEIGHTS_FILE = "adapter_model.safetensors"
_KEY_PREFIX = "base_model.model."
_SUFFIXES = {".lora_A.weight": 0, ".lora_B.weight": 1}


class LoRAAdapterError(ValueError):
    """An adapter that cannot be served; the message says what to change."""


@dataclass(frozen=True)
class AdapterConfig:
    rank: int
    scaling: float
    target_modules: tuple[str, ...]
    base_model_name_or_path: str | None


@dataclass
class LoRAAdapter:
    """One adapter's tensors on the host: HF module name -> (A [r, in], scaling * B [out, r])."""

    request: LoRARequest
    config: AdapterConfig
    weights: dict[str, tuple[torch.Tensor, torch.Tensor]]

    @property
    def nbytes(self) -> int:
        return sum(a.nbytes + b.nbytes for a, b in self.weights.values())


def read_adapter_config(request: LoRARequest, max_lora_rank: int) -> AdapterConfig:
    """Check the folder, its files and ``adapter_config.json`` (not the tensors)."""
    name, folder = request.lora_name, Path(request.lora_path)
    if not folder.is_dir():
        raise LoRAAdapterError(
            f"LoRA adapter {name!r}: {request.lora_path!r} is not a local folder; pass the "
            f"folder holding {CONFIG_FILE} and {WEIGHTS_FILE}"
        )
    for file in (CONFIG_FILE, WEIGHTS_FILE):
        if not (folder / file).is_file():
            hint = (
                " (adapter_model.bin is not read: save the adapter with safetensors)"
                if file == WEIGHTS_FILE and (folder / "adapter_model.bin").is_file()
                else ""
            )
            raise LoRAAdapterError(
                f"LoRA adapter {name!r}: {folder / file} is missing{hint}; a PEFT adapter "
                f"folder holds {CONFIG_FILE} and {WEIGHTS_FILE}"
            )
    try:
        raw = json.loads((folder / CONFIG_FILE).read_text())
    except (OSError, json.JSONDecodeError) as exc:
        raise LoRAAdapterError(f"LoRA adapter {name!r}: cannot read {CONFIG_FILE}: {exc}") from None
    return _parse_config(name, raw, max_lora_rank)


def _parse_config(name: str, raw: dict[str, Any], max_lora_rank: int) -> AdapterConfig:
    if raw.get("peft_type", "LORA") != "LORA":
        raise LoRAAdapterError(
            f"LoRA adapter {name!r}: peft_type is {raw.get('peft_type')!r}; only LORA is served"
        )
    rank = int(raw.get("r", 0))
    if rank < 1:
        raise LoRAAdapterError(f"LoRA adapter {name!r}: rank r={rank} must be at least 1")
    if rank > max_lora_rank:
        raise LoRAAdapterError(
            f"LoRA adapter {name!r} has rank {rank}, above --max-lora-rank {max_lora_rank}; "
            f"raise --max-lora-rank to at least {rank} (LLM(max_lora_rank={rank}))"
        )
    unsupported = {
        "use_dora": bool(raw.get("use_dora")),
        "modules_to_save": bool(raw.get("modules_to_save")),
        "rank_pattern": bool(raw.get("rank_pattern")),
        "alpha_pattern": bool(raw.get("alpha_pattern")),
        "bias": raw.get("bias", "none") not in (None, "none"),
    }
    bad = [key for key, on in unsupported.items() if on]
    if bad:
        raise LoRAAdapterError(
            f"LoRA adapter {name!r} sets {', '.join(bad)}, which the engine does not serve; "
            "train it as a plain LoRA (no DoRA, no saved full modules, one rank and alpha, "
            "bias 'none')"
        )
    targets = raw.get("target_modules") or []
    if isinstance(targets, str):
        targets = list(SUPPORTED_TARGET_MODULES) if targets == "all-linear" else [targets]
    unknown = sorted(t for t in targets if t.rsplit(".", 1)[-1] not in SUPPORTED_TARGET_MODULES)
    if unknown:
        raise LoRAAdapterError(
            f"LoRA adapter {name!r} targets unknown modules {unknown}; the engine serves "
            f"LoRA on {', '.join(SUPPORTED_TARGET_MODULES)}"
        )
    alpha = float(raw.get("lora_alpha", rank))
    scaling = alpha / math.sqrt(rank) if raw.get("use_rslora") else alpha / rank
    base = raw.get("base_model_name_or_path")
    return AdapterConfig(rank, scaling, tuple(targets), str(base) if base else None)


def _module_of(name: str, key: str) -> tuple[str, int]:
    """``base_model.model.X.lora_A.weight`` -> (``X``, 0); anything else is an error."""
    for suffix, index in _SUFFIXES.items():
        if key.endswith(suffix):
            module = key[: -len(suffix)].removeprefix(_KEY_PREFIX)
            if module.rsplit(".", 1)[-1] not in SUPPORTED_TARGET_MODULES:
                raise LoRAAdapterError(
                    f"LoRA adapter {name!r} has weights for unknown target module "
                    f"{module!r}; the engine serves LoRA on {', '.join(SUPPORTED_TARGET_MODULES)}"
                )
            return module, index
    raise LoRAAdapterError(
        f"LoRA adapter {name!r}: tensor {key!r} is not a lora_A/lora_B weight (embeddings, "
        "biases and saved modules are not served)"
    )


def expected_shapes(hf_config: Any) -> dict[str, tuple[int, int]]:
    """(in, out) of each LoRA-servable projection of a Llama-style model, by short name."""
    hidden = int(hf_config.hidden_size)
    heads = int(hf_config.num_attention_heads)
    kv_heads = int(getattr(hf_config, "num_key_value_heads", None) or heads)
    head_dim = int(getattr(hf_config, "head_dim", None) or hidden // heads)
    inter = int(getattr(hf_config, "intermediate_size", 0) or 0)
    q, kv = heads * head_dim, kv_heads * head_dim
    return {
        "q_proj": (hidden, q), "k_proj": (hidden, kv), "v_proj": (hidden, kv),
        "o_proj": (q, hidden), "qkv_proj": (hidden, q + 2 * kv),
        "gate_proj": (hidden, inter), "up_proj": (hidden, inter),
        "down_proj": (inter, hidden), "gate_up_proj": (hidden, 2 * inter),
    }  # fmt: skip


def check_adapter(
    request: LoRARequest, max_lora_rank: int, hf_config: Any | None = None
) -> AdapterConfig:
    """Validate an adapter folder without loading its tensors (see the module docstring)."""
    from safetensors import safe_open

    config = read_adapter_config(request, max_lora_rank)
    path = Path(request.lora_path) / WEIGHTS_FILE
    try:
        with safe_open(str(path), framework="pt") as f:
            shapes = {key: tuple(f.get_slice(key).get_shape()) for key in f.keys()}  # noqa: SIM118
    except Exception as exc:
        message = f"LoRA adapter {request.lora_name!r}: cannot read {path}: {exc}"
        raise LoRAAdapterError(message) from None
    modules: dict[str, list[tuple[int, ...]]] = {}
    for key, shape in shapes.items():
        module, index = _module_of(request.lora_name, key)
        modules.setdefault(module, [(), ()])[index] = shape
    if not modules:
        raise LoRAAdapterError(f"LoRA adapter {request.lora_name!r}: {path} has no LoRA weights")
    expected = expected_shapes(hf_config) if hf_config is not None else {}
    num_layers = int(getattr(hf_config, "num_hidden_layers", 0) or 0)
    for module, (a_shape, b_shape) in modules.items():
        _check_module(request, config, module, a_shape, b_shape, expected, num_layers)
    return config


def _check_module(
    request: LoRARequest, config: AdapterConfig, module: str, a_shape: tuple[int, ...],
    b_shape: tuple[int, ...], expected: dict[str, tuple[int, int]], num_layers: int,
) -> None:  # fmt: skip
    name = request.lora_name
    if len(a_shape) != 2 or len(b_shape) != 2 or a_shape[0] != b_shape[1]:
        raise LoRAAdapterError(
            f"LoRA adapter {name!r}: module {module!r} needs lora_A [r, in] and lora_B "
            f"[out, r], got {list(a_shape) or 'none'} and {list(b_shape) or 'none'}"
        )
    if a_shape[0] > config.rank and a_shape[0] > 0:
        raise LoRAAdapterError(
            f"LoRA adapter {name!r}: module {module!r} has rank {a_shape[0]}, above the "
            f"config's r={config.rank}"
        )
    short = module.rsplit(".", 1)[-1]
    want = expected.get(short)
    got = (a_shape[1], b_shape[0])
    layer = _layer_index(module)
    mismatch = want is not None and got != want
    if mismatch or (num_layers and layer is not None and layer >= num_layers):
        detail = (
            f"is [in={got[0]}, out={got[1]}] but the served model's is "
            f"[in={want[0]}, out={want[1]}]"
            if mismatch and want is not None
            else f"is in layer {layer} but the served model has {num_layers} layers"
        )
        trained = config.base_model_name_or_path or "an unnamed base model"
        raise LoRAAdapterError(
            f"LoRA adapter {name!r} does not fit the served model (base-model mismatch: it "
            f"was trained on {trained}): module {module!r} {detail}; serve the adapter with "
            "the model it was trained on"
        )


def _layer_index(module: str) -> int | None:
    parts = module.split(".")
    for i, part in enumerate(parts[:-1]):
        if part == "layers" and parts[i + 1].isdigit():
            return int(parts[i + 1])
    return None


def adapter_modules(request: LoRARequest) -> set[str]:
    """The HF module names the adapter's tensors target (reads only the file's header)."""
    from safetensors import safe_open

    path = Path(request.lora_path) / WEIGHTS_FILE
    with safe_open(str(path), framework="pt") as f:
        keys = list(f.keys())  # noqa: SIM118
    return {_module_of(request.lora_name, key)[0] for key in keys}


def check_targets(request: LoRARequest, servable: Callable[[str], bool], model: str) -> None:
    """``LoRAAdapterError`` unless every module the adapter targets is a LoRA-capable
    projection of the served model (``servable``: the runner's test)."""
    missing = sorted(m for m in adapter_modules(request) if not servable(m))
    if missing:
        shown = ", ".join(repr(m) for m in missing[:3]) + (" ..." if len(missing) > 3 else "")
        raise LoRAAdapterError(
            f"LoRA adapter {request.lora_name!r} targets {shown}, which {model} does not "
            "run as LoRA-capable projections (base-model mismatch, or a layer such as MoE "
            "experts that adapters cannot target); serve it with the model it was trained on"
        )


def load_adapter(request: LoRARequest, max_lora_rank: int) -> LoRAAdapter:
    """Read the adapter's tensors (float32 on the host; the scaling folded into B)."""
    from safetensors.torch import load_file

    config = read_adapter_config(request, max_lora_rank)
    tensors = load_file(str(Path(request.lora_path) / WEIGHTS_FILE))
    pairs: dict[str, list[torch.Tensor | None]] = {}
    for key, tensor in tensors.items():
        module, index = _module_of(request.lora_name, key)
        pairs.setdefault(module, [None, None])[index] = tensor
    weights: dict[str, tuple[torch.Tensor, torch.Tensor]] = {}
    for module, (a, b) in pairs.items():
        if a is None or b is None:
            raise LoRAAdapterError(
                f"LoRA adapter {request.lora_name!r}: module {module!r} has only one of "
                "lora_A and lora_B"
            )
        weights[module] = (a.float(), b.float() * config.scaling)
    return LoRAAdapter(request, config, weights)
