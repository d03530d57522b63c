"""Mixture-of-experts feed-forward: top-k routing and a fused expert layer.

``route`` turns router logits into each token's top-k experts and weights (softmax in
float32, top-k, optional renormalisation over the k: Mixtral always, Qwen3-MoE when
``norm_topk_prob``). ``FusedMoE`` holds every expert's weights stacked::

    w13 [num_experts, 2 * I, hidden]   rows 0..I-1: gate_proj, rows I..2I-1: up_proj
    w2  [num_experts, hidden, I]       down_proj

loaded from per-expert checkpoint tensors (``load_expert``), and computes
``sum_k weight_k * down_e(silu(gate_e(x)) * up_e(x))`` for each token's experts ``e``:

- reference path (any device): a loop over the experts that received tokens;
- Triton path (CUDA, or ``ENGINE_FUSED_OPS=force`` in the interpreter): tokens sorted by
  expert, then two grouped GEMMs (``engine_sdk.layers._moe_kernels``), the first with the
  gate, the up projection and SiLU-and-mul fused.

Tensor parallelism shards the intermediate dimension ``I`` of every expert (gate/up rows,
down columns) and sums the ranks' outputs; every rank holds every expert, so expert
parallelism can later give each rank a subset of ``num_experts`` instead.
"""

from __future__ import annotations

import os

import torch

from engine_sdk.layers.parallel import TensorParallelGroup

__all__ = ["FusedMoE", "moe_reference", "route", "use_triton_moe"]


def route(
    router_logits: torch.Tensor, top_k: int, renormalize: bool
) -> tuple[torch.Tensor, torch.Tensor]:
    """(weights float32 [T, top_k], expert ids int64 [T, top_k]) from logits [T, E]."""
    probs = torch.softmax(router_logits, dim=-1, dtype=torch.float32)
    weights, ids = torch.topk(probs, top_k, dim=-1)
    if renormalize:
        weights = weights / weights.sum(dim=-1, keepdim=True)
    return weights, ids


def moe_reference(
    x: torch.Tensor,
    w13: torch.Tensor,
    w2: torch.Tensor,
    weights: torch.Tensor,
    ids: torch.Tensor,
) -> torch.Tensor:
    """The experts in torch, one matmul pair per expert that received tokens.

    Each expert's output is rounded to ``x``'s dtype and scaled by its weight in that
    dtype, as transformers does, then summed in ``x``'s dtype.
    """
    out = torch.zeros_like(x)
    inter = w2.shape[-1]
    weights = weights.to(x.dtype)
    for expert in torch.unique(ids).tolist():
        tokens, slots = torch.where(ids == expert)
        gate_up = x[tokens] @ w13[expert].t()
        hidden = torch.nn.functional.silu(gate_up[:, :inter]) * gate_up[:, inter:]
        y = (hidden @ w2[expert].t()) * weights[tokens, slots, None]
        out.index_add_(0, tokens, y)
    return out


def use_triton_moe(x: torch.Tensor) -> bool:
    """The Triton path runs on CUDA (``ENGINE_FUSED_OPS=0`` turns it off) and on the CPU
    in Triton's interpreter when ``ENGINE_FUSED_OPS=force`` (tests)."""
    setting = os.environ.get("ENGINE_FUSED_OPS", "1")
    if setting == "0" or (not x.is_cuda and setting != "force"):
        return False
    try:
        import triton  # noqa: F401
    except ImportError:
        return False
    return True


class FusedMoE(torch.nn.Module):
    """Every expert of one MoE layer, stacked; this rank's slice of the intermediate dim."""

    def __init__(
        self,
        num_experts: int,
        top_k: int,
        hidden_size: int,
        intermediate_size: int,
        renormalize: bool,
        params_dtype: torch.dtype | None = None,
        prefix: str = "",
        tp: TensorParallelGroup | None = None,
    ) -> None:
        super().__init__()
        size = tp.size if tp is not None else 1
        if intermediate_size % size:
            raise ValueError(
                f"{prefix}: the expert intermediate size {intermediate_size} does not split "
                f"over --tensor-parallel-size {size}; use a size that divides it"
            )
        if not 0 < top_k <= num_experts:
            raise ValueError(f"{prefix}: top_k {top_k} must be in 1..{num_experts} (experts)")
        self.num_experts, self.top_k, self.renormalize = num_experts, top_k, renormalize
        self.hidden_size = hidden_size
        self.full_intermediate = intermediate_size
        self.intermediate = intermediate_size // size
        self.prefix, self.tp = prefix, tp
        w13 = torch.empty(num_experts, 2 * self.intermediate, hidden_size, dtype=params_dtype)
        w2 = torch.empty(num_experts, hidden_size, self.intermediate, dtype=params_dtype)
        self.w13 = torch.nn.Parameter(w13, requires_grad=False)
        self.w2 = torch.nn.Parameter(w2, requires_grad=False)

    def load_expert(self, expert: int, which: str, tensor: torch.Tensor) -> None:
        """Copy one checkpoint tensor: ``which`` is ``gate``, ``up`` or ``down``; ``tensor``
        has the full (unsharded) shape, ``[I, hidden]`` or ``[hidden, I]``."""
        if not 0 <= expert < self.num_experts:
            raise ValueError(
                f"{self.prefix}: checkpoint has expert {expert}, the config {self.num_experts}"
            )
        full, local, hidden = self.full_intermediate, self.intermediate, self.hidden_size
        start = (self.tp.rank if self.tp is not None else 0) * local
        expected = (hidden, full) if which == "down" else (full, hidden)
        if tuple(tensor.shape) != expected:
            raise ValueError(
                f"{self.prefix}: expert {expert} {which}_proj has shape {tuple(tensor.shape)}, "
                f"the config expects {expected}"
            )
        if which == "gate":
            self.w13.data[expert, :local].copy_(tensor[start : start + local])
        elif which == "up":
            self.w13.data[expert, local:].copy_(tensor[start : start + local])
        elif which == "down":
            self.w2.data[expert].copy_(tensor[:, start : start + local])
        else:
            raise ValueError(f"{self.prefix}: unknown expert projection {which!r}")

    def forward(self, x: torch.Tensor, router_logits: torch.Tensor) -> torch.Tensor:
        """x [T, hidden], router_logits [T, num_experts] -> [T, hidden] (summed over ranks)."""
        weights, ids = route(router_logits, self.top_k, self.renormalize)
        if use_triton_moe(x):
            from engine_sdk.layers._moe_kernels import fused_moe

            out = fused_moe(x, self.w13, self.w2, weights, ids)
        else:
            out = moe_reference(x, self.w13, self.w2, weights, ids)
        if self.tp is not None:
            out = self.tp.all_reduce(out)
        return out

    def extra_repr(self) -> str:
        return (
            f"experts={self.num_experts}, top_k={self.top_k}, hidden={self.hidden_size}, "
            f"intermediate={self.intermediate}, renormalize={self.renormalize}"
        )
