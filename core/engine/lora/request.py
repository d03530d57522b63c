"""``LoRARequest``: which adapter a request runs with (vLLM's name and fields)."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class LoRARequest:
    """An adapter by name, a positive id unique among loaded adapters, and its PEFT folder.

    ``lora_int_id`` tells two loads of one name apart: it is part of the prefix-cache key
    (``cache_key``), so blocks computed with one adapter are never reused by another.
    """

    lora_name: str
    lora_int_id: int
    lora_path: str = ""
    base_model_name: str | None = None

    def __post_init__(self) -> None:
        if self.lora_int_id < 1:
            raise ValueError(f"lora_int_id must be a positive integer, got {self.lora_int_id}")
        if not self.lora_name:
            raise ValueError("lora_name must not be empty")

    @property
    def cache_key(self) -> str:
        """The extra key of this adapter's prefix-cache block hashes."""
        return f"{self.lora_int_id}:{self.lora_name}"
