"""``LoRAConfig``: the LoRA settings of one engine, validated with the flags to change."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from engine.config import EngineArgs

__all__ = ["LoRAConfig"]


@dataclass(frozen=True)
class LoRAConfig:
    max_loras: int = 1  # distinct adapters in one batch (device slots)
    max_lora_rank: int = 16  # slot rank; adapters of lower rank are zero-padded
    max_cpu_loras: int = 1  # adapters kept loaded on the host (LRU)
    merge_single_adapter: bool = False  # a step's one adapter added into the weights

    def __post_init__(self) -> None:
        for flag, value in (
            ("max-loras", self.max_loras),
            ("max-lora-rank", self.max_lora_rank),
            ("max-cpu-loras", self.max_cpu_loras),
        ):
            if value < 1:
                raise ValueError(f"--{flag} must be at least 1, got {value}")
        if self.max_cpu_loras < self.max_loras:
            raise ValueError(
                f"--max-cpu-loras ({self.max_cpu_loras}) must be at least --max-loras "
                f"({self.max_loras}); raise it to {self.max_loras} or leave it unset"
            )

    @classmethod
    def from_engine_args(cls, args: EngineArgs) -> LoRAConfig | None:
        """None without ``--enable-lora``."""
        if not args.enable_lora:
            if args.lora_merge_single_adapter:
                raise ValueError("--lora-merge-single-adapter needs --enable-lora")
            return None
        if args.tensor_parallel_size > 1:
            raise ValueError(
                "--enable-lora is not supported with --tensor-parallel-size > 1 yet; serve "
                "adapters on one GPU per replica (--data-parallel-size) instead"
            )
        max_cpu = args.max_cpu_loras if args.max_cpu_loras is not None else args.max_loras
        return cls(args.max_loras, args.max_lora_rank, max_cpu, args.lora_merge_single_adapter)

    @staticmethod
    def slot_bytes(
        max_loras: int,
        max_lora_rank: int,
        projections: list[tuple[int, int, int]],
        dtype_bytes: int,
    ) -> int:
        """Device bytes of the slots: per projection (in, out, num_slices),
        ``max_loras * max_lora_rank * (num_slices * (in + out) + out) * dtype_bytes`` (``A``,
        ``B``, and ``B`` transposed block-diagonally for the many-token path)."""
        return sum(
            max_loras * max_lora_rank * (slices * (n_in + n_out) + n_out) * dtype_bytes
            for n_in, n_out, slices in projections
        )
