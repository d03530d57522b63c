"""Dequantizing GGUF tensors into torch tensors with Hugging Face names and layout.

Two layout fixes happen here:

* GGUF lists dimensions innermost first, so a ``[in, out]`` GGUF shape is a torch
  ``(out, in)`` weight; ``gguf.quants.dequantize`` already returns rows in torch order.
* llama.cpp's converter permutes the rows of llama ``attn_q`` / ``attn_k`` so its
  interleaved rope sees pairs (x0, x1), (x2, x3)...; transformers' ``rotate_half`` rope
  pairs x_i with x_{i + d/2}. Per head of ``d`` rows the converter did

      hf rows   [0 1 2 3 | 4 5 6 7]   (two halves)
      gguf rows [0 4 1 5 2 6 3 7]     (halves interleaved)

  and ``reverse_permute`` undoes it (heads = num_kv_heads for ``attn_k``).
"""

from __future__ import annotations

from collections.abc import Iterator

import gguf
import numpy as np
import torch

from engine_gguf.architectures import get_architecture
from engine_gguf.metadata import GGUFFile
from engine_gguf.tensor_names import CONFIG_ONLY_TENSORS, hf_name


def read_tensor_f32(gf: GGUFFile, name: str) -> np.ndarray:
    """GGUF tensor ``name`` dequantized to float32, in torch dimension order."""
    tensor = gf.tensors[name]
    try:
        values = gguf.quants.dequantize(tensor.data, tensor.tensor_type)
    except NotImplementedError as e:
        raise ValueError(
            f"GGUF tensor {name!r} uses quantization {tensor.tensor_type.name}, which the "
            f"installed gguf package cannot dequantize: {e}"
        ) from e
    return np.asarray(values, dtype=np.float32).reshape(gf.torch_shape(name))


def reverse_permute(weight: np.ndarray, num_heads: int) -> np.ndarray:
    """Undo llama.cpp's q/k row permutation (works for weights and 1-D biases)."""
    head_dim = weight.shape[0] // num_heads
    if head_dim * num_heads != weight.shape[0] or head_dim % 2:
        raise ValueError(
            f"cannot un-permute {weight.shape[0]} rows into {num_heads} heads of even size"
        )
    rows = weight.reshape(num_heads, head_dim // 2, 2, *weight.shape[1:])
    return rows.swapaxes(1, 2).reshape(weight.shape)


def iter_hf_weights(
    gf: GGUFFile, num_heads: int, num_kv_heads: int, dtype: torch.dtype
) -> Iterator[tuple[str, torch.Tensor]]:
    """Every model tensor of ``gf`` as (HF name, ``dtype`` tensor), one at a time."""
    permuted_qk = get_architecture(gf.architecture).permuted_qk
    for name in gf.tensors:
        if name in CONFIG_ONLY_TENSORS:
            continue
        target = hf_name(name, gf.architecture)
        values = read_tensor_f32(gf, name)
        if permuted_qk and ".attn_q." in name:
            values = reverse_permute(values, num_heads)
        elif permuted_qk and ".attn_k." in name:
            values = reverse_permute(values, num_kv_heads)
        if not values.flags.writeable or not values.flags.c_contiguous:
            values = np.array(values, copy=True, order="C")
        yield target, torch.from_numpy(values).to(dtype)
