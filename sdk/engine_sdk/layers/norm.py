"""RMSNorm, computed in float32 and cast back exactly as Hugging Face Llama/Qwen3 do."""

from __future__ import annotations

import torch

from engine_sdk.layers import fused_ops


class RMSNorm(torch.nn.Module):
    """``weight * (x / sqrt(mean(x^2) + eps))``; statistics in float32 whatever the dtype."""

    def __init__(self, hidden_size: int, eps: float = 1e-6, dtype: torch.dtype | None = None):
        super().__init__()
        self.weight = torch.nn.Parameter(torch.ones(hidden_size, dtype=dtype), requires_grad=False)
        self.eps = eps

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if fused_ops.enabled(x):
            return fused_ops.rms_norm(x, self.weight, self.eps)
        input_dtype = x.dtype
        x32 = x.to(torch.float32)
        variance = x32.pow(2).mean(-1, keepdim=True)
        x32 = x32 * torch.rsqrt(variance + self.eps)
        # HF casts back before the weight multiply; keeping the order keeps bf16 parity.
        return self.weight * x32.to(input_dtype)

    def add_forward(
        self, x: torch.Tensor, residual: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """``(norm(x + residual), x + residual)``: the decoder's residual add fused into the
        norm on CUDA (one kernel instead of two); the sum is rounded to the dtype first,
        exactly as the separate add would store it."""
        if fused_ops.enabled(x):
            return fused_ops.add_rms_norm(x, residual, self.weight, self.eps)
        summed = x + residual
        return self.forward(summed), summed

    def extra_repr(self) -> str:
        return f"{tuple(self.weight.shape)}, eps={self.eps}"
