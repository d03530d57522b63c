"""Host-to-device copies that do not make the host wait.

A copy from ordinary (pageable) host memory makes PyTorch synchronise the stream, which
stalls the host until every queued kernel has run. Staging the tensor in pinned memory
and copying with ``non_blocking=True`` queues the copy instead; PyTorch's pinned-memory
cache keeps the staging buffer alive until the copy has run. The sampler's per-row
parameters and index lists go through here, so a sampler call syncs only once, when the
sampled token ids come back.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch


def to_device(tensor: torch.Tensor, device: torch.device) -> torch.Tensor:
    """``tensor`` (on the host) on ``device``, queued without a host sync on CUDA."""
    if device.type != "cuda" or tensor.device == device:
        return tensor.to(device)
    if not tensor.is_pinned():
        tensor = tensor.pin_memory()
    return tensor.to(device, non_blocking=True)


def host_tensor(
    values: Sequence[int] | Sequence[float], dtype: torch.dtype, device: torch.device
) -> torch.Tensor:
    """A 1-D tensor of Python ``values`` on ``device``, copied without a host sync."""
    return to_device(torch.tensor(values, dtype=dtype), device)
