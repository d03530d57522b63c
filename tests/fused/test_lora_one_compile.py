"""One compiled LoRA kernel per projection for every token count: nothing a step passes to
the shrink and expand kernels may make Triton compile another variant after startup.

Triton compiles a kernel once per set of constexprs and per class of each int argument it
specializes on (equal to 1, a multiple of 16, or neither). The launches of the per-token
kernels (5 to 127 tokens: eager prefill chunks) and of the blocked kernels (128 tokens and
up) are recorded without running them; across all token counts each kernel must see one
set of constexprs and one class per int argument it specializes on. Before round 11 the
parts count set the expand's ``BLOCK_P`` and the token count was specialized on: a step of
a new size compiled new variants while requests waited (0.85 s inside a W1 run)."""

from __future__ import annotations

import pytest
import torch
from engine_sdk.layers import _lora_kernels, split_k
from engine_sdk.layers.lora import LoRAContext, LoRALayer, lora_expand_triton, lora_shrink_triton

KERNELS = (
    "lora_shrink_kernel",
    "lora_expand_kernel",
    "lora_shrink_blocked_kernel",
    "lora_expand_blocked_kernel",
)


def _not_specialized(kernel) -> set[str]:
    """The kernel's ``do_not_specialize`` names (compiled: the JITFunction's; in the
    interpreter: the decorator's arguments)."""
    names = getattr(kernel, "do_not_specialize", None)
    if names is None:
        names = kernel.kwargs.get("do_not_specialize")
    return set(names or ())


def _int_class(value: int) -> str:
    return "one" if value == 1 else "x16" if value % 16 == 0 else "other"


@pytest.fixture
def launches(monkeypatch):
    monkeypatch.setattr(split_k, "num_multiprocessors", lambda device: 132)
    monkeypatch.setenv("ENGINE_LORA_KERNELS", "force")
    recorded: dict[str, list[tuple[dict[str, int], tuple]]] = {}

    class Recording:
        def __init__(self, name, kernel):
            self.name, self.kernel = name, kernel

        def __getitem__(self, grid):
            def launch(*args, **constexprs):
                ints = {
                    name: value
                    for name, value in zip(self.kernel.arg_names, args, strict=False)
                    if type(value) is int
                }
                recorded.setdefault(self.name, []).append((ints, tuple(sorted(constexprs.items()))))

            return launch

    for name in KERNELS:
        monkeypatch.setattr(_lora_kernels, name, Recording(name, getattr(_lora_kernels, name)))
    return recorded


def test_every_token_count_shares_one_compiled_kernel(launches):
    k, sizes, num_slots = 1024, (2048, 1024, 1024), 4  # q/k/v of the Qwen3-0.6B shape
    layer = LoRALayer(LoRAContext(8, "cpu"), num_slots, 16, k, sizes, torch.bfloat16, "cpu")
    for num_tokens in (*range(5, 128, 3), 128, 129, 200, 256, 1000, 2048, 4097, 8192):
        x = torch.zeros(num_tokens, k, dtype=torch.bfloat16)
        y = torch.zeros(num_tokens, sum(sizes), dtype=torch.bfloat16)
        slots = torch.arange(num_tokens, dtype=torch.int32) % (num_slots + 1) - 1
        parts = lora_shrink_triton(x, layer.lora_a, slots, parts=True)
        lora_expand_triton(y, parts, layer.lora_b, slots, layer.slices)
    assert set(launches) == set(KERNELS)
    for name, calls in launches.items():
        free = _not_specialized(getattr(_lora_kernels, name).kernel)
        constexprs = {c for _, c in calls}
        assert len(constexprs) == 1, (name, constexprs)
        for arg in calls[0][0]:
            if arg in free:
                continue
            classes = {_int_class(ints[arg]) for ints, _ in calls}
            assert len(classes) == 1, (name, arg, classes)
