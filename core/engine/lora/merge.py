"""Single-adapter merging (``--lora-merge-single-adapter``): while every request of a step
uses one adapter, its ``B A`` is added into the base weights in place, and the step runs
the base model's kernels and CUDA graphs with no LoRA launch at all; the first step that
needs anything else (another adapter, a base request, a mix) gets the base weights back
from a device copy taken at startup, so a merge never drifts them::

    steps   {a} {a} {a} ... {a, base} {a, b} ... {b} {b}
    weights  W   W+a W+a     W         W           W   W+b    (a step runs LoRA on W)

A step's adapters are merged once the same single adapter has held for
``MERGE_AFTER_STEPS`` consecutive steps, so traffic that changes every step does not copy
the weights every step. Costs: one device copy of every adapter-capable weight (the
merge's memory, taken before the KV cache is sized), and per switch one copy of those
weights plus one ``B A`` product per projection slice. Only unquantized weights merge
(a quantized weight has no exact in-place sum).

The merged weight is ``W + B A`` rounded once from float32 (``B`` holds the adapter's
scaling), what transformers + PEFT compute with the adapter merged. The copies and the
products are queued on the device's stream after the step in flight, which finishes on
the weights it started with (async scheduling stays correct).
"""

from __future__ import annotations

import logging
from collections.abc import Sequence

import torch
from engine_sdk.layers.linear import Linear

from engine.lora.request import LoRARequest

logger = logging.getLogger(__name__)

__all__ = ["MERGE_AFTER_STEPS", "AdapterMerger", "merge_refusal"]

MERGE_AFTER_STEPS = 2


def merge_refusal(layers: Sequence[Linear], dtype: torch.dtype) -> str | None:
    """Why these layers' weights cannot take a merged adapter, or None."""
    for layer in layers:
        if not layer.has_plain_weight:
            method = type(layer.quant_method).__name__
            return (
                f"--lora-merge-single-adapter needs unquantized weights, but {layer.prefix} "
                f"runs {method}; drop the flag or serve the unquantized model"
            )
        weight = layer.weight
        if weight.dtype != dtype or weight.dim() != 2:
            return (
                f"--lora-merge-single-adapter: {layer.prefix}'s weight is {weight.dtype} "
                f"{tuple(weight.shape)}, not a {dtype} matrix; drop the flag"
            )
    return None


class AdapterMerger:
    """Merges one adapter's slot into the weights of ``layers`` (each with its ``lora``
    slots) and restores them; :meth:`step` applies the policy of the module docstring."""

    def __init__(self, layers: Sequence[Linear], dtype: torch.dtype) -> None:
        refusal = merge_refusal(layers, dtype)
        if refusal is not None:
            raise ValueError(refusal)
        self.layers = list(layers)
        self.originals = [layer.weight.detach().clone() for layer in self.layers]
        self.merged: int | None = None  # the lora_int_id in the weights now
        self._streak: tuple[int | None, int] = (None, 0)  # (single adapter, steps in a row)
        self.merges = 0  # merges done (tests, the debug log)

    @property
    def nbytes(self) -> int:
        return sum(t.nbytes for t in self.originals)

    def step(self, requests: Sequence[LoRARequest | None], slots: list[int]) -> list[int]:
        """The slots the step's tokens use: all -1 when the step's one adapter is (now)
        merged, else ``slots`` on the base weights (restored first if an adapter was in)."""
        if not requests:
            return slots
        ids = {None if r is None else r.lora_int_id for r in requests}
        single = next(iter(ids)) if len(ids) == 1 else None
        held, count = self._streak
        self._streak = (single, count + 1 if single == held else 1)
        if single is not None and single == self.merged:
            return [-1] * len(slots)
        if self.merged is not None:
            self.restore()
        if single is None or self._streak[1] < MERGE_AFTER_STEPS:
            return slots
        self.merge(slots[0], single)
        return [-1] * len(slots)

    def merge(self, slot: int, lora_int_id: int) -> None:
        """``W += B A`` of ``slot`` for every layer (the weights hold the base now)."""
        assert self.merged is None
        for layer, original in zip(self.layers, self.originals, strict=True):
            lora = layer.lora
            assert lora is not None
            rank, offset = lora.max_rank, 0
            for i, size in enumerate(lora.slice_sizes):
                a = lora.lora_a[slot, i * rank : (i + 1) * rank].float()
                b = lora.lora_b[slot, offset : offset + size].float()
                rows = original[offset : offset + size].float()
                layer.weight.data[offset : offset + size] = torch.addmm(rows, b, a)
                offset += size
        self.merged = lora_int_id
        self.merges += 1
        logger.debug("LoRA adapter %d merged into the weights (merge %d)", lora_int_id, self.merges)

    def restore(self) -> None:
        """The base weights back, exactly."""
        for layer, original in zip(self.layers, self.originals, strict=True):
            layer.weight.data.copy_(original)
        self.merged = None

    def forget(self, lora_int_id: int) -> None:
        """An unloaded adapter leaves the weights (and the streak) now."""
        if self.merged == lora_int_id:
            self.restore()
        if self._streak[0] == lora_int_id:
            self._streak = (None, 0)
