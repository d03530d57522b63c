"""Build the model a plugin provides and fill its weights (checkpoint or dummy).

Phases: pick device and dtype, parse the quantization config, find the architecture's
plugin class, build it on the device, load the checkpoint (or random weights for
``--load-format dummy``), check every parameter was filled, let quantization methods
post-process their layers.

dtype ``auto``: the checkpoint's ``dtype``/``torch_dtype`` on GPU (bfloat16 when the
checkpoint says float32); float32 on CPU, where half-precision matmuls are slow and
float32 gives exact parity with Hugging Face references. Explicit values are honoured.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import torch
from engine_sdk.interfaces.attention import AttentionBackend, AttentionLayerConfig
from engine_sdk.interfaces.model import ModelArchitecture, ModelContext
from engine_sdk.interfaces.quantization import QuantizationConfig, QuantizationMethod

from engine.config import EngineArgs
from engine.errors import StartupError
from engine.model_executor.plugin_needs import quantization_needs
from engine.model_executor.source import ModelSource
from engine.plugins import PluginError

if TYPE_CHECKING:
    from engine.plugins import PluginManager

logger = logging.getLogger(__name__)

__all__ = ["LoadConfig", "load_model", "resolve_device", "resolve_dtype"]

_DTYPES = {
    "float32": torch.float32,
    "float": torch.float32,
    "float16": torch.float16,
    "half": torch.float16,
    "bfloat16": torch.bfloat16,
}
_LOAD_FORMATS = ("auto", "safetensors", "dummy")


def resolve_device(device: str) -> torch.device:
    """``auto`` is CUDA when available, else the CPU."""
    if device == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    try:
        resolved = torch.device(device)
    except RuntimeError:
        raise StartupError(f"--device {device!r} is not a device; use auto, cpu or cuda") from None
    if resolved.type == "cuda" and not torch.cuda.is_available():
        raise StartupError("--device cuda was given but no CUDA GPU is available; use --device cpu")
    if resolved.type not in ("cpu", "cuda"):
        raise StartupError(f"--device {device!r} is not supported; use auto, cpu or cuda")
    return resolved


def _config_dtype(hf_config: Any) -> torch.dtype | None:
    value = getattr(hf_config, "dtype", None) or getattr(hf_config, "torch_dtype", None)
    if isinstance(value, torch.dtype):
        return value
    if isinstance(value, str):
        return _DTYPES.get(value.removeprefix("torch."))
    return None


def resolve_dtype(dtype: str, hf_config: Any, device: torch.device) -> torch.dtype:
    """The model dtype for ``--dtype`` (see the module docstring for ``auto``)."""
    if dtype != "auto":
        if dtype not in _DTYPES:
            raise StartupError(
                f"--dtype {dtype!r} is not supported; use auto, float16, bfloat16 or float32"
            )
        return _DTYPES[dtype]
    if device.type == "cpu":
        return torch.float32
    config_dtype = _config_dtype(hf_config)
    if config_dtype in (torch.float16, torch.bfloat16):
        return config_dtype
    return torch.bfloat16 if torch.cuda.is_bf16_supported() else torch.float16


def _quant_dict(hf_config: Any) -> dict[str, Any] | None:
    qc = getattr(hf_config, "quantization_config", None)
    if qc is None:
        return None
    if not isinstance(qc, dict):
        qc = qc.to_dict() if hasattr(qc, "to_dict") else dict(vars(qc))
    return dict(qc)


def resolve_quant_config(
    args: EngineArgs, hf_config: Any, pm: PluginManager, device: torch.device
) -> QuantizationConfig | None:
    """The checkpoint's ``quantization_config`` or ``--quantization``; its plugin is loaded."""
    checkpoint = _quant_dict(hf_config)
    checkpoint_method = (checkpoint or {}).get("quant_method")
    name = args.quantization or checkpoint_method
    if name is None:
        logger.info("Quantization: none (the checkpoint declares none and --quantization is unset)")
        return None
    if args.quantization and checkpoint_method and args.quantization != checkpoint_method:
        raise StartupError(
            f"--quantization {args.quantization!r} conflicts with the checkpoint's "
            f"quant_method {checkpoint_method!r}; drop --quantization or use another checkpoint"
        )
    try:
        config_cls = pm.require_quant_method(str(name))
    except Exception as exc:
        raise StartupError(str(exc)) from exc
    try:
        quant_config: QuantizationConfig = config_cls.from_config(checkpoint or {})
    except (ValueError, KeyError, TypeError) as exc:  # a plugin refusing this checkpoint
        where = "--quantization" if args.quantization else "the checkpoint's quantization_config"
        raise StartupError(f"quantization {name!r} ({where}): {exc}") from exc
    try:
        needs = quantization_needs(device, quant_config.allow_reference)
        pm.check_quantization(str(name), needs)
    except PluginError as exc:
        raise StartupError(str(exc)) from exc
    problem = quant_config.check_device(device)  # what the spec's data cannot say
    if problem is not None:
        raise StartupError(f"quantization {name!r} cannot run on {device}: {problem}")
    where = "--quantization" if args.quantization else "the checkpoint's quant_method"
    logger.info("Quantization: %s (from %s)", name, where)
    return quant_config


def find_architecture(pm: PluginManager, hf_config: Any, where: str) -> type[ModelArchitecture]:
    architectures = list(getattr(hf_config, "architectures", None) or [])
    if not architectures:
        raise StartupError(
            f"{where}: config.json has no 'architectures' list, so the model class is unknown; "
            'add e.g. "architectures": ["LlamaForCausalLM"]'
        )
    try:
        cls: type[ModelArchitecture] = pm.find_model_architecture(architectures[0])
    except Exception as exc:
        raise StartupError(f"{where}: {exc}") from exc
    return cls


@dataclass
class LoadConfig:
    """Everything ``load_model`` needs besides the source and the plugin manager."""

    device: torch.device
    dtype: torch.dtype
    block_size: int
    make_attention: Callable[[AttentionLayerConfig], AttentionBackend]
    kv_cache_dtype: str = "auto"


def _init_dummy_weights(model: torch.nn.Module, seed: int, device: torch.device) -> None:
    """Random weights in HF's init style (normal 0.02, norms near one), seeded."""
    gen = torch.Generator(device=device).manual_seed(seed)
    for name, param in model.named_parameters():
        if not param.is_floating_point():
            param.data.zero_()
        elif param.dim() == 1 and "norm" in name:
            param.data.fill_(1.0)
        else:
            data = torch.empty(param.shape, dtype=torch.float32, device=device)
            param.data.copy_(data.normal_(0.0, 0.02, generator=gen))


def _load_checkpoint(model: ModelArchitecture, source: ModelSource, dtype: torch.dtype) -> None:
    try:
        loaded = model.load_weights(source.iter_weights(dtype))
    except ValueError as exc:
        raise StartupError(f"cannot load the weights of {source.path}: {exc}") from exc
    missing = sorted({name for name, _ in model.named_parameters()} - set(loaded))
    if missing:
        shown = ", ".join(missing[:8]) + (" ..." if len(missing) > 8 else "")
        raise StartupError(
            f"{source.path} does not provide {len(missing)} parameter(s) of "
            f"{type(model).__name__}: {shown}. The checkpoint is incomplete or for another "
            "architecture; use --load-format dummy to run with random weights"
        )


def load_model(
    args: EngineArgs, pm: PluginManager, source: ModelSource, config: LoadConfig
) -> ModelArchitecture:
    """Build the plugin's model on ``config.device`` and fill its weights."""
    if args.load_format not in _LOAD_FORMATS:
        raise StartupError(
            f"--load-format {args.load_format!r} is not supported; use {', '.join(_LOAD_FORMATS)}"
        )
    from engine.model_executor.pooling_task import pooling_model_class, resolve_pooling

    pooling = resolve_pooling(args, pm, source.hf_config, source.path)
    if pooling is not None:
        model_cls = pooling_model_class(pm, pooling)
    else:
        model_cls = find_architecture(pm, source.hf_config, str(source.path))
    ctx = ModelContext(
        hf_config=source.hf_config,
        dtype=config.dtype,
        device=config.device,
        block_size=config.block_size,
        make_attention=config.make_attention,
        quant_config=resolve_quant_config(args, source.hf_config, pm, config.device),
        kv_cache_dtype=config.kv_cache_dtype,
    )
    try:
        with torch.device(config.device):
            model = model_cls(ctx)
    except ValueError as exc:  # unsupported config values (rope type, activation, ...)
        raise StartupError(f"cannot build {model_cls.__name__} for {source.path}: {exc}") from exc
    model.eval()
    if args.load_format == "dummy":
        _init_dummy_weights(model, args.seed, config.device)
    else:
        _load_checkpoint(model, source, config.dtype)
    for module in model.modules():
        method = getattr(module, "quant_method", None)
        if isinstance(method, QuantizationMethod):
            method.process_weights_after_loading(module)
    merge = getattr(model, "merge_projections", None)
    if callable(merge) and os.environ.get("ENGINE_MERGE_PROJECTIONS", "1") != "0":
        merge()  # q/k/v and gate/up as one GEMM each (plain weights only)
    return model
