"""Quantize a tiny HF checkpoint into the fp8, compressed-tensors and AutoAWQ GEMM layouts.

Written from the formats' documentation (vLLM / llm-compressor / AutoAWQ), independently of
the plugins' code, so the end-to-end tests check the plugins against the formats:

- fp8 (vLLM / AutoFP8): ``weight`` float8_e4m3fn [out, in], ``weight_scale`` float32 scalar,
  ``input_scale`` float32 scalar when ``activation_scheme`` is ``static``; with
  ``weight_block_size`` [b0, b1] a ``weight_scale_inv`` [ceil(out/b0), ceil(in/b1)].
- compressed-tensors float8: ``weight`` float8 + ``weight_scale`` [out, 1] (channel) or [1]
  (tensor), config_groups describing the scheme.
- AutoAWQ GEMM: ``qweight`` int32 [in, out/8], ``qzeros`` int32 [in/g, out/8], ``scales``
  fp16 [in/g, out], 4-bit values packed with ``order_map = [0, 2, 4, 6, 1, 3, 5, 7]``.

Every writer also returns the dequantized state dict, and :func:`write_reference` stores it
as an ordinary float32 checkpoint: the model the quantized one must behave like.
"""

from __future__ import annotations

import json
import math
import shutil
from pathlib import Path
from typing import Any

import torch
from safetensors.torch import load_file, save_file

E4M3_MAX = 448.0
LINEAR_SUFFIXES = tuple(
    f"{p}.weight"
    for p in ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")
)
AWQ_ORDER_MAP = [0, 2, 4, 6, 1, 3, 5, 7]

State = dict[str, torch.Tensor]


def load_state(model_dir: Path) -> State:
    return load_file(str(model_dir / "model.safetensors"))


def is_linear(name: str) -> bool:
    return name.startswith("model.layers.") and name.endswith(LINEAR_SUFFIXES)


def _write(src: Path, dst: Path, state: State, quantization_config: dict[str, Any] | None) -> Path:
    shutil.copytree(src, dst)
    save_file({k: v.contiguous() for k, v in state.items()}, str(dst / "model.safetensors"))
    config = json.loads((dst / "config.json").read_text())
    config.pop("quantization_config", None)
    if quantization_config is not None:
        config["quantization_config"] = quantization_config
    (dst / "config.json").write_text(json.dumps(config, indent=2))
    return dst


def write_reference(src: Path, dst: Path, dequantized: State) -> Path:
    """The same model with every quantized weight replaced by its dequantized value."""
    return _write(src, dst, {k: v.float() for k, v in dequantized.items()}, None)


def _fp8(w: torch.Tensor, scale: torch.Tensor) -> torch.Tensor:
    return (w / scale).clamp(-E4M3_MAX, E4M3_MAX).to(torch.float8_e4m3fn)


def fp8_per_tensor(w: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(fp8 weight, scalar scale, dequantized) with max |w| mapped to 448."""
    w = w.float()
    scale = w.abs().max() / E4M3_MAX
    q = _fp8(w, scale)
    return q, scale, q.float() * scale


def _fp8_blocks(
    w: torch.Tensor, block: tuple[int, int]
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    rows, cols = w.shape
    b0, b1 = block
    scales = torch.empty(math.ceil(rows / b0), math.ceil(cols / b1))
    q = torch.empty(rows, cols, dtype=torch.float8_e4m3fn)
    deq = torch.empty(rows, cols)
    for i in range(scales.shape[0]):
        for j in range(scales.shape[1]):
            tile = w[i * b0 : (i + 1) * b0, j * b1 : (j + 1) * b1].float()
            scales[i, j] = tile.abs().max() / E4M3_MAX
            q_tile = _fp8(tile, scales[i, j])
            q[i * b0 : (i + 1) * b0, j * b1 : (j + 1) * b1] = q_tile
            deq[i * b0 : (i + 1) * b0, j * b1 : (j + 1) * b1] = q_tile.float() * scales[i, j]
    return q, scales, deq


def write_fp8(
    src: Path, dst: Path, static: bool = False, block: tuple[int, int] | None = None
) -> State:
    """The fp8 layout; returns the dequantized state."""
    state, dequantized = load_state(src), {}
    out: State = {}
    for name, tensor in state.items():
        if not is_linear(name):
            out[name] = dequantized[name] = tensor
            continue
        base = name.removesuffix(".weight")
        if block is None:
            q, scale, deq = fp8_per_tensor(tensor)
            out[f"{base}.weight_scale"] = scale.reshape(())
        else:
            q, scale, deq = _fp8_blocks(tensor, block)
            out[f"{base}.weight_scale_inv"] = scale
        out[name], dequantized[name] = q, deq
        if static:
            out[f"{base}.input_scale"] = torch.tensor(0.02)
    config: dict[str, Any] = {
        "quant_method": "fp8",
        "activation_scheme": "static" if static else "dynamic",
    }
    if block is not None:
        config["weight_block_size"] = list(block)
    _write(src, dst, out, config)
    return dequantized


def write_compressed_tensors(src: Path, dst: Path) -> State:
    """compressed-tensors float8, per-channel weights, dynamic per-token activations
    (llm-compressor's FP8_DYNAMIC scheme)."""
    state, dequantized = load_state(src), {}
    out: State = {}
    for name, tensor in state.items():
        if not is_linear(name):
            out[name] = dequantized[name] = tensor
            continue
        w = tensor.float()
        scale = w.abs().amax(dim=1, keepdim=True) / E4M3_MAX
        q = _fp8(w, scale)
        out[name], out[name.removesuffix(".weight") + ".weight_scale"] = q, scale
        dequantized[name] = q.float() * scale
    float8 = {"num_bits": 8, "type": "float", "symmetric": True}
    config = {
        "quant_method": "compressed-tensors",
        "format": "float-quantized",
        "quantization_status": "compressed",
        "config_groups": {
            "group_0": {
                "targets": ["Linear"],
                "weights": {**float8, "strategy": "channel", "dynamic": False},
                "input_activations": {**float8, "strategy": "token", "dynamic": True},
                "output_activations": None,
            }
        },
        "ignore": ["lm_head"],
    }
    _write(src, dst, out, config)
    return dequantized


def autoawq_pack(intweight: torch.Tensor) -> torch.Tensor:
    """AutoAWQ's packing loop: nibble i of int32 ``col`` holds column col*8 + order_map[i]."""
    rows, cols = intweight.shape
    packed = torch.zeros(rows, cols // 8, dtype=torch.int64)
    for col in range(cols // 8):
        for i in range(8):
            packed[:, col] |= intweight[:, col * 8 + AWQ_ORDER_MAP[i]].to(torch.int64) << (i * 4)
    return torch.where(packed >= 2**31, packed - 2**32, packed).to(torch.int32)


def write_awq(src: Path, dst: Path, group_size: int = 32) -> State:
    """AutoAWQ GEMM (asymmetric 4-bit with zero points, fp16 scales per group)."""
    state, dequantized = load_state(src), {}
    out: State = {}
    for name, tensor in state.items():
        if not is_linear(name):
            out[name] = dequantized[name] = tensor
            continue
        w = tensor.float().t()  # [in, out]
        num_in, num_out = w.shape
        groups = w.reshape(num_in // group_size, group_size, num_out)
        w_max, w_min = groups.amax(dim=1), groups.amin(dim=1)
        scales = ((w_max - w_min) / 15).clamp(min=1e-5).half()
        zeros = torch.clamp(-torch.round(w_min / scales.float()), 0, 15).to(torch.int32)
        s_rows = scales.float().repeat_interleave(group_size, dim=0)
        z_rows = zeros.repeat_interleave(group_size, dim=0)
        intweight = torch.clamp(torch.round(w / s_rows) + z_rows, 0, 15).to(torch.int32)
        base = name.removesuffix(".weight")
        out[f"{base}.qweight"] = autoawq_pack(intweight)
        out[f"{base}.qzeros"] = autoawq_pack(zeros)
        out[f"{base}.scales"] = scales
        dequantized[name] = ((intweight - z_rows).float() * s_rows).t().contiguous()
    config = {
        "quant_method": "awq",
        "bits": 4,
        "group_size": group_size,
        "zero_point": True,
        "version": "gemm",
        "modules_to_not_convert": None,
    }
    _write(src, dst, out, config)
    return dequantized


def write_bf16(src: Path, dst: Path) -> Path:
    """The model stored in bfloat16 (the usual input of online quantization)."""
    state = {k: v.to(torch.bfloat16) for k, v in load_state(src).items()}
    _write(src, dst, state, None)
    config = json.loads((dst / "config.json").read_text())
    config["dtype"] = "bfloat16"
    (dst / "config.json").write_text(json.dumps(config, indent=2))
    return dst


def online_fp8_reference(bf16_dir: Path) -> State:
    """What ``--quantization fp8`` (per-tensor weights) should compute with: each linear
    weight quantize-dequantized with one scale."""
    state = {k: v.float() for k, v in load_state(bf16_dir).items()}
    return {k: fp8_per_tensor(v)[2] if is_linear(k) else v for k, v in state.items()}
