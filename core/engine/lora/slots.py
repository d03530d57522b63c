"""The runner's adapters: host copies (LRU, ``--max-cpu-loras``) and device slots.

At startup every ``Linear`` an adapter may target gets a ``LoRALayer`` with
``--max-loras`` slots of rank ``--max-lora-rank`` (``engine_sdk.layers.lora``). Each step
``assign`` gives every scheduled request the slot of its adapter, writing an adapter into
a free or least-recently-used slot when it is not on the device yet; the scheduler admits
at most ``--max-loras`` distinct adapters into the running set, so a step's adapters
always fit. Slot writes are queued on the device's stream after the step in flight, which
finishes with the old contents (async scheduling)::

    step adapters {a, c}    slots [a, b]  ->  c replaces b (not used this step)  ->  [a, c]
    requests  r0:a r1:- r2:c   ->  slot per request [0, -1, 1]  ->  per token (runner)
"""

from __future__ import annotations

import logging
from collections import OrderedDict
from collections.abc import Sequence
from typing import Any

import torch
from engine_sdk.layers.linear import Linear
from engine_sdk.layers.lora import LoRAContext, LoRALayer, lora_target_layers
from engine_sdk.layers.lora_dense import warm_up_dense

from engine.lora.adapter import LoRAAdapter, LoRAAdapterError, load_adapter
from engine.lora.config import LoRAConfig
from engine.lora.merge import AdapterMerger
from engine.lora.request import LoRARequest

logger = logging.getLogger(__name__)

__all__ = ["LoRASlotManager", "split_fused_modules"]

# Checkpoint-fused projections (Phi-3) that the engine loads as separate ones: an adapter on
# the fused module is one A and a B whose rows are the parts' outputs, in this order.
FUSED_PARTS = {"qkv_proj": ("q_proj", "k_proj", "v_proj"), "gate_up_proj": ("gate_proj", "up_proj")}


def split_fused_modules(
    weights: dict[str, tuple[torch.Tensor, torch.Tensor]], part_sizes: dict[str, int]
) -> dict[str, tuple[torch.Tensor, torch.Tensor]]:
    """``X.qkv_proj: (A, B)`` -> ``X.q_proj: (A, B[q rows])``, ... when the model runs
    q/k/v as its own projections (``part_sizes``: output size of each); others unchanged::

        B [q + k + v, r]  ->  B_q [q, r], B_k [k, r], B_v [v, r]   (A shared)
    """
    out: dict[str, tuple[torch.Tensor, torch.Tensor]] = {}
    for name, (a, b) in weights.items():
        prefix, _, short = name.rpartition(".")
        parts = [f"{prefix}.{p}" for p in FUSED_PARTS.get(short, ())]
        if name in part_sizes or not parts or not all(p in part_sizes for p in parts):
            out[name] = (a, b)
            continue
        sizes = [part_sizes[p] for p in parts]
        if sum(sizes) != b.shape[0]:
            raise LoRAAdapterError(
                f"module {name!r}: lora_B has {b.shape[0]} rows but the model's "
                f"{'/'.join(FUSED_PARTS[short])} have {sum(sizes)} outputs together"
            )
        for part, rows in zip(parts, torch.split(b, sizes), strict=True):
            out[part] = (a, rows)
    return out


class LoRASlotManager:
    def __init__(
        self,
        model: torch.nn.Module,
        config: LoRAConfig,
        max_num_tokens: int,
        device: torch.device,
        dtype: torch.dtype,
    ) -> None:
        self.config = config
        self.device = device
        self.dtype = dtype
        self.context = LoRAContext(max_num_tokens, device)
        self.targets: dict[str, Linear] = lora_target_layers(model)
        if not self.targets:
            raise LoRAAdapterError(
                f"--enable-lora: {type(model).__name__} has no Linear projections an adapter "
                "can target; serve it without --enable-lora"
            )
        # Output size of each HF module the model computes (merged layers: per part).
        self.part_sizes = {
            name: size for layer in self.targets.values() for name, size in layer.parts
        }
        self.layers: list[Linear] = []
        for layer in dict.fromkeys(self.targets.values()):
            layer.lora = LoRALayer(
                self.context,
                config.max_loras,
                config.max_lora_rank,
                layer.input_size,
                [size for _, size in layer.parts],
                dtype,
                device,
            )
            self.layers.append(layer)
        if torch.device(device).type == "cuda":  # the dense path's kernels now, not later
            warm_up_dense(dtype, device)
        self._host: OrderedDict[int, LoRAAdapter] = OrderedDict()  # lora_int_id, LRU first
        self._slots: list[int | None] = [None] * config.max_loras  # slot -> lora_int_id
        self._slot_use: list[int] = [0] * config.max_loras  # last step that used each slot
        self._step = 0
        # --lora-merge-single-adapter: a step's one adapter in the weights (engine.lora.merge)
        self.merger = AdapterMerger(self.layers, dtype) if config.merge_single_adapter else None
        if self.merger is not None:
            logger.info(
                "LoRA: single-adapter merging on (%.1f MiB of base weights kept on %s)",
                self.merger.nbytes / 2**20,
                device,
            )
        logger.info(
            "LoRA: %d projections x %d slots of rank %d (%.1f MiB on %s)",
            len(self.layers),
            config.max_loras,
            config.max_lora_rank,
            self.slot_bytes / 2**20,
            device,
        )

    @property
    def slot_bytes(self) -> int:
        layers = [layer.lora for layer in self.layers if layer.lora is not None]
        return sum(x.lora_a.nbytes + x.lora_b.nbytes + x.lora_bt.nbytes for x in layers)

    def servable(self, module: str) -> bool:
        """Whether an adapter may target ``module`` (a checkpoint-fused name counts when the
        model runs all of its parts)."""
        if module in self.part_sizes:
            return True
        prefix, _, short = module.rpartition(".")
        parts = FUSED_PARTS.get(short)
        return parts is not None and all(f"{prefix}.{p}" in self.part_sizes for p in parts)

    @property
    def active_ids(self) -> list[int]:
        return [i for i in self._slots if i is not None]

    def assign(self, requests: Sequence[LoRARequest | None]) -> list[int]:
        """The slot of each request's adapter (-1: none, or the adapter is merged into the
        weights this step), loading adapters as needed."""
        self._step += 1
        wanted = list(dict.fromkeys(r for r in requests if r is not None))
        if len(wanted) > len(self._slots):
            raise RuntimeError(
                f"a step needs {len(wanted)} adapters but there are {len(self._slots)} slots "
                "(--max-loras); the scheduler should have kept the others waiting"
            )
        by_id = {r.lora_int_id: r for r in wanted}
        slot_of: dict[int, int] = {}
        for slot, lora_id in enumerate(self._slots):
            if lora_id is not None and lora_id in by_id:
                slot_of[lora_id] = slot
        for request in wanted:
            if request.lora_int_id not in slot_of:
                slot = self._free_slot(set(slot_of.values()))
                self._write_slot(slot, request)
                slot_of[request.lora_int_id] = slot
        for slot in slot_of.values():
            self._slot_use[slot] = self._step
        slots = [-1 if r is None else slot_of[r.lora_int_id] for r in requests]
        return slots if self.merger is None else self.merger.step(requests, slots)

    def remove(self, lora_int_id: int) -> None:
        """Forget an unloaded adapter (host copy, slot, and the weights if merged)."""
        self._host.pop(lora_int_id, None)
        if self.merger is not None:
            self.merger.forget(lora_int_id)
        for slot, held in enumerate(self._slots):
            if held == lora_int_id:
                self._slots[slot] = None

    def _free_slot(self, taken: set[int]) -> int:
        empty = [s for s, held in enumerate(self._slots) if held is None and s not in taken]
        if empty:
            return empty[0]
        candidates = [s for s in range(len(self._slots)) if s not in taken]
        return min(candidates, key=lambda s: self._slot_use[s])

    def _host_adapter(self, request: LoRARequest) -> LoRAAdapter:
        adapter = self._host.get(request.lora_int_id)
        if adapter is not None:
            self._host.move_to_end(request.lora_int_id)
            return adapter
        adapter = load_adapter(request, self.config.max_lora_rank)
        adapter.weights = split_fused_modules(adapter.weights, self.part_sizes)
        missing = sorted(m for m in adapter.weights if m not in self.targets)
        if missing:
            raise LoRAAdapterError(
                f"LoRA adapter {request.lora_name!r} targets modules the served model does not "
                f"have as LoRA-capable projections: {missing[:4]}; serve it with the model it "
                "was trained on"
            )
        self._host[request.lora_int_id] = adapter
        while len(self._host) > self.config.max_cpu_loras:
            self._host.popitem(last=False)
        return adapter

    def _write_slot(self, slot: int, request: LoRARequest) -> None:
        adapter = self._host_adapter(request)
        for layer in self.layers:
            lora = layer.lora
            assert lora is not None
            pairs: list[tuple[torch.Tensor, torch.Tensor] | None] = []
            for name, _ in layer.parts:
                pair = adapter.weights.get(name)
                pairs.append(
                    None
                    if pair is None
                    else (pair[0].to(self.device, self.dtype), pair[1].to(self.device, self.dtype))
                )
            lora.set_slot(slot, pairs)
        self._slots[slot] = request.lora_int_id
        logger.info("LoRA adapter %r loaded into slot %d", request.lora_name, slot)

    def describe(self) -> dict[str, Any]:
        return {"slots": list(self._slots), "host": list(self._host)}
