"""Tensor-parallel layers: column/row-parallel linears, vocabulary-parallel embedding and head.

The engine builds the model of each tensor-parallel rank inside ``tensor_parallel(group)``;
layers read ``current_tensor_parallel()`` when they are built (``None`` outside a group of
two or more ranks, where models build their plain layers). Every sharded parameter gets a
``weight_loader`` that narrows the full checkpoint tensor to this rank's shard, so the
generic ``load_weights`` fills shards one tensor at a time and no rank holds the whole
model. The Megatron layout::

    x ─> [q|k|v, gate|up  column-parallel: rank r holds output rows r*n/tp .. (r+1)*n/tp]
       ─> per-rank attention heads / MLP columns
       ─> [o_proj, down_proj  row-parallel: rank r holds input columns]  ─> all-reduce ─> y

KV heads are split like query heads; with fewer KV heads than ranks each rank holds the
one KV head its query heads use (replicated over ``tp / num_kv_heads`` ranks)::

    4 query heads, 1 KV head, tp 2:  rank 0: q0 q1 + kv0    rank 1: q2 q3 + kv0

The vocabulary is split in ``ceil(vocab / tp)`` rows per rank (the last shard padded with
zero rows); the embedding sums the ranks' masked lookups, the head all-gathers logits.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager
from contextvars import ContextVar
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import torch

from engine_sdk.layers.activation import act_and_mul, check_gated_activation
from engine_sdk.layers.embedding import LMHead, VocabEmbedding
from engine_sdk.layers.linear import Linear

if TYPE_CHECKING:
    from engine_sdk.interfaces.quantization import QuantizationConfig

__all__ = [
    "ColumnParallelLinear",
    "HeadShards",
    "ParallelGatedMLP",
    "ParallelLMHead",
    "RowParallelLinear",
    "TensorParallelGroup",
    "VocabParallelEmbedding",
    "current_tensor_parallel",
    "shard_attention_heads",
    "tensor_parallel",
    "valid_tensor_parallel_sizes",
]


@dataclass(frozen=True)
class TensorParallelGroup:
    """This process's place in a tensor-parallel group and the collectives over it.

    ``group`` is a ``torch.distributed`` process group (``None``: the default group).
    """

    rank: int
    size: int
    group: Any = None

    def all_reduce(self, x: torch.Tensor) -> torch.Tensor:
        """Sum ``x`` over the ranks, in place."""
        import torch.distributed as dist

        dist.all_reduce(x, group=self.group)
        return x

    def all_gather(self, x: torch.Tensor, dim: int = -1) -> torch.Tensor:
        """Concatenate every rank's ``x`` along ``dim``, rank 0 first."""
        import torch.distributed as dist

        x = x.contiguous()
        parts = [torch.empty_like(x) for _ in range(self.size)]
        dist.all_gather(parts, x, group=self.group)
        return torch.cat(parts, dim=dim)


_CURRENT: ContextVar[TensorParallelGroup | None] = ContextVar("engine_tp_group", default=None)


@contextmanager
def tensor_parallel(group: TensorParallelGroup) -> Iterator[None]:
    """Build models inside this block to get this rank's shards (size 1: plain layers)."""
    token = _CURRENT.set(group if group.size > 1 else None)
    try:
        yield
    finally:
        _CURRENT.reset(token)


def current_tensor_parallel() -> TensorParallelGroup | None:
    """The group models are being built for; ``None`` without tensor parallelism."""
    return _CURRENT.get()


# -- which sizes fit a model ----------------------------------------------------------------


def valid_tensor_parallel_sizes(
    num_heads: int, num_kv_heads: int, intermediate_size: int
) -> list[int]:
    """Sizes that split the query heads and the MLP evenly and the KV heads evenly or
    into replicas (``tp`` a multiple of ``num_kv_heads``)."""
    return [
        size
        for size in range(1, num_heads + 1)
        if num_heads % size == 0
        and intermediate_size % size == 0
        and (num_kv_heads % size == 0 or size % num_kv_heads == 0)
    ]


@dataclass(frozen=True)
class HeadShards:
    """One rank's attention heads; its KV heads are shard ``kv_shard_index`` of
    ``num_kv_shards`` equal slices of the K/V projections."""

    num_heads: int
    num_kv_heads: int
    kv_shard_index: int
    num_kv_shards: int


def shard_attention_heads(num_heads: int, num_kv_heads: int, tp: TensorParallelGroup) -> HeadShards:
    if num_heads % tp.size != 0 or (num_kv_heads % tp.size != 0 and tp.size % num_kv_heads != 0):
        divisors = [
            s
            for s in range(1, num_heads + 1)
            if num_heads % s == 0 and (num_kv_heads % s == 0 or s % num_kv_heads == 0)
        ]
        raise ValueError(
            f"tensor parallel size {tp.size} does not split {num_heads} attention heads "
            f"({num_kv_heads} KV heads); valid sizes: {', '.join(map(str, divisors))}"
        )
    num_kv_shards = min(tp.size, num_kv_heads)
    return HeadShards(
        num_heads=num_heads // tp.size,
        num_kv_heads=num_kv_heads // num_kv_shards,
        kv_shard_index=tp.rank * num_kv_shards // tp.size,
        num_kv_shards=num_kv_shards,
    )


# -- weight loading -------------------------------------------------------------------------

WeightLoader = Callable[[torch.nn.Parameter, torch.Tensor], None]


def _shard_loader(prefix: str, dim: int, index: int, num_shards: int) -> WeightLoader:
    """Copy slice ``index`` of ``num_shards`` along ``dim`` of the full tensor."""

    def load(param: torch.nn.Parameter, tensor: torch.Tensor) -> None:
        size = param.shape[dim]
        expected = list(param.shape)
        expected[dim] = size * num_shards
        if list(tensor.shape) != expected:
            raise ValueError(
                f"checkpoint tensor for {prefix} has shape {tuple(tensor.shape)}, "
                f"the model expects {tuple(expected)} (split in {num_shards} along dim {dim})"
            )
        param.data.copy_(tensor.narrow(dim, index * size, size))

    return load


def _attach_loader(param: torch.nn.Parameter | None, loader: WeightLoader) -> None:
    if param is not None:
        param.weight_loader = loader  # type: ignore[attr-defined]


def _reject_quantization(quant_config: QuantizationConfig | None, prefix: str) -> None:
    if quant_config is not None:
        raise ValueError(
            f"{prefix}: tensor parallelism does not support quantized checkpoints yet; "
            "use --tensor-parallel-size 1 or an unquantized checkpoint"
        )


# -- layers ---------------------------------------------------------------------------------


class ColumnParallelLinear(Linear):
    """Holds output rows ``shard_index`` of ``num_shards`` (default: this rank of ``tp``);
    the output stays split across ranks."""

    def __init__(
        self,
        input_size: int,
        output_size: int,
        bias: bool = False,
        quant_config: QuantizationConfig | None = None,
        prefix: str = "",
        params_dtype: torch.dtype | None = None,
        *,
        tp: TensorParallelGroup,
        shard_index: int | None = None,
        num_shards: int | None = None,
    ) -> None:
        _reject_quantization(quant_config, prefix)
        num_shards = tp.size if num_shards is None else num_shards
        shard_index = tp.rank if shard_index is None else shard_index
        if output_size % num_shards != 0:
            raise ValueError(f"{prefix}: {output_size} outputs do not split in {num_shards}")
        super().__init__(input_size, output_size // num_shards, bias, None, prefix, params_dtype)
        self.full_output_size = output_size
        loader = _shard_loader(prefix, 0, shard_index, num_shards)
        _attach_loader(self.weight, loader)  # type: ignore[arg-type]
        _attach_loader(self.bias, loader)


class RowParallelLinear(Linear):
    """Holds input columns of this rank; sums the partial products over the ranks and
    adds the (unsplit) bias once."""

    def __init__(
        self,
        input_size: int,
        output_size: int,
        bias: bool = False,
        quant_config: QuantizationConfig | None = None,
        prefix: str = "",
        params_dtype: torch.dtype | None = None,
        *,
        tp: TensorParallelGroup,
    ) -> None:
        _reject_quantization(quant_config, prefix)
        if input_size % tp.size != 0:
            raise ValueError(f"{prefix}: {input_size} inputs do not split in {tp.size}")
        super().__init__(input_size // tp.size, output_size, bias, None, prefix, params_dtype)
        self.tp = tp
        self.full_input_size = input_size
        _attach_loader(self.weight, _shard_loader(prefix, 1, tp.rank, tp.size))  # type: ignore[arg-type]

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out = self.tp.all_reduce(self.quant_method.apply(self, x, None))
        return out if self.bias is None else out + self.bias


class ParallelGatedMLP(torch.nn.Module):
    """``GatedMLP`` with gate/up column-parallel and down row-parallel (same names)."""

    def __init__(
        self,
        hidden_size: int,
        intermediate_size: int,
        hidden_act: str = "silu",
        bias: bool = False,
        quant_config: QuantizationConfig | None = None,
        prefix: str = "",
        params_dtype: torch.dtype | None = None,
        *,
        tp: TensorParallelGroup,
    ) -> None:
        super().__init__()
        check_gated_activation(hidden_act)
        self.hidden_act = hidden_act
        args = (bias, quant_config)
        self.gate_proj = ColumnParallelLinear(
            hidden_size, intermediate_size, *args, f"{prefix}.gate_proj", params_dtype, tp=tp
        )
        self.up_proj = ColumnParallelLinear(
            hidden_size, intermediate_size, *args, f"{prefix}.up_proj", params_dtype, tp=tp
        )
        self.down_proj = RowParallelLinear(
            intermediate_size, hidden_size, *args, f"{prefix}.down_proj", params_dtype, tp=tp
        )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        hidden = act_and_mul(self.gate_proj(x), self.up_proj(x), self.hidden_act)
        out: torch.Tensor = self.down_proj(hidden)
        return out


def _vocab_range(vocab_size: int, tp: TensorParallelGroup) -> tuple[int, int, int]:
    """(rows per shard, first id, number of real ids) of this rank's vocabulary slice."""
    per_shard = -(-vocab_size // tp.size)
    start = min(tp.rank * per_shard, vocab_size)
    return per_shard, start, min(per_shard, vocab_size - start)


def _vocab_loader(prefix: str, vocab_size: int, start: int, num_real: int) -> WeightLoader:
    def load(param: torch.nn.Parameter, tensor: torch.Tensor) -> None:
        expected = (vocab_size, param.shape[1])
        if tuple(tensor.shape) != expected:
            raise ValueError(
                f"checkpoint tensor for {prefix} has shape {tuple(tensor.shape)}, "
                f"the model expects {expected}"
            )
        param.data[:num_real].copy_(tensor.narrow(0, start, num_real))
        param.data[num_real:].zero_()

    return load


class VocabParallelEmbedding(VocabEmbedding):
    """Rows ``[start, start + num_real)`` of the embedding; other ids look up zeros here
    and the all-reduce adds the owning rank's row."""

    def __init__(
        self,
        vocab_size: int,
        hidden_size: int,
        dtype: torch.dtype | None = None,
        *,
        tp: TensorParallelGroup,
        prefix: str = "model.embed_tokens",
    ) -> None:
        per_shard, start, num_real = _vocab_range(vocab_size, tp)
        super().__init__(per_shard, hidden_size, dtype)
        self.vocab_size = vocab_size
        self.start, self.num_real = start, num_real
        self.tp = tp
        _attach_loader(self.weight, _vocab_loader(prefix, vocab_size, self.start, self.num_real))

    def forward(self, input_ids: torch.Tensor) -> torch.Tensor:
        local_ids = input_ids - self.start
        outside = (local_ids < 0) | (local_ids >= self.num_real)
        out = torch.nn.functional.embedding(local_ids.masked_fill(outside, 0), self.weight)
        out.masked_fill_(outside.unsqueeze(-1), 0)
        return self.tp.all_reduce(out)


class ParallelLMHead(LMHead):
    """This rank's vocabulary rows; logits are all-gathered so every rank samples from
    the full ``[n, vocab_size]`` float32 logits."""

    def __init__(
        self,
        vocab_size: int,
        hidden_size: int,
        dtype: torch.dtype | None = None,
        *,
        tp: TensorParallelGroup,
        prefix: str = "lm_head",
    ) -> None:
        per_shard, start, num_real = _vocab_range(vocab_size, tp)
        super().__init__(per_shard, hidden_size, dtype)
        self.vocab_size = vocab_size
        self.tp = tp
        _attach_loader(self.weight, _vocab_loader(prefix, vocab_size, start, num_real))

    def forward(self, hidden_states: torch.Tensor) -> torch.Tensor:
        local = torch.nn.functional.linear(hidden_states, self.weight)
        return self.tp.all_gather(local, dim=-1)[..., : self.vocab_size].float()
