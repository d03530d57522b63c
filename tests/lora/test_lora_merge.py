"""Single-adapter merging (``--lora-merge-single-adapter``, ``engine.lora.merge``): the
policy (merge after two steps of one adapter, restore for anything else, forget on
unload), the weights (``W + B A`` rounded once while merged, the base bit for bit after),
greedy tokens equal to transformers + PEFT through the offline API for each adapter in
turn, base requests between them and a mixed batch, and the refusal of quantized weights.
"""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace

import pytest
import torch
from engine import LLM, LoRARequest, SamplingParams
from engine.errors import StartupError
from engine.lora import merge
from engine.lora.merge import MERGE_AFTER_STEPS, AdapterMerger, merge_refusal
from lora_builders import hf_lora_greedy

PROMPTS = [[5, 17, 42, 99, 7], [3, 3, 8, 120, 64, 11, 2], [200, 1, 77]]
MAX_TOKENS = 8


def _policy_merger(monkeypatch: pytest.MonkeyPatch) -> tuple[AdapterMerger, list[str]]:
    """A merger with no layers whose merge/restore only record what they were asked."""
    merger = AdapterMerger([], torch.float32)
    events: list[str] = []

    def fake_merge(slot: int, lora_int_id: int) -> None:
        events.append(f"merge {lora_int_id} from slot {slot}")
        merger.merged = lora_int_id

    def fake_restore() -> None:
        events.append("restore")
        merger.merged = None

    monkeypatch.setattr(merger, "merge", fake_merge)
    monkeypatch.setattr(merger, "restore", fake_restore)
    return merger, events


def test_policy_merges_after_a_streak_and_restores_for_anything_else(monkeypatch) -> None:
    merger, events = _policy_merger(monkeypatch)
    a, b = LoRARequest("a", 1, "/a"), LoRARequest("b", 2, "/b")
    assert MERGE_AFTER_STEPS == 2
    assert merger.step([a, a], [0, 0]) == [0, 0] and events == []  # one step: not yet
    assert merger.step([a, a], [0, 0]) == [-1, -1]
    assert events == ["merge 1 from slot 0"]
    assert merger.step([a], [0]) == [-1] and len(events) == 1  # stays merged, no new work
    assert merger.step([a, None], [0, -1]) == [0, -1]  # a base request: the base weights
    assert events[-1] == "restore"
    assert merger.step([b], [1]) == [1]
    assert merger.step([b], [1]) == [-1] and events[-1] == "merge 2 from slot 1"
    assert merger.step([a], [0]) == [0] and events[-1] == "restore"  # another adapter
    assert merger.step([None], [-1]) == [-1] and merger.step([None], [-1]) == [-1]
    assert events.count("merge 1 from slot 0") == 1  # base steps never merge
    assert merger.step([], []) == []


def test_forget_restores_the_merged_adapter(monkeypatch) -> None:
    merger, events = _policy_merger(monkeypatch)
    a = LoRARequest("a", 1, "/a")
    merger.step([a], [0])
    merger.step([a], [0])
    merger.forget(2)
    assert merger.merged == 1 and events == ["merge 1 from slot 0"]
    merger.forget(1)
    assert merger.merged is None and events[-1] == "restore"
    assert merger.step([a], [0]) == [0]  # the streak starts again after an unload


def test_refuses_quantized_or_foreign_weights() -> None:
    quantized = SimpleNamespace(
        has_plain_weight=False, quant_method=SimpleNamespace(), prefix="model.layers.0.qkv"
    )
    reason = merge_refusal([quantized], torch.bfloat16)  # type: ignore[list-item]
    assert reason and "--lora-merge-single-adapter" in reason and "model.layers.0.qkv" in reason
    fp32 = SimpleNamespace(has_plain_weight=True, weight=torch.zeros(2, 2), prefix="o")
    reason = merge_refusal([fp32], torch.bfloat16)  # type: ignore[list-item]
    assert reason and "torch.float32" in reason
    with pytest.raises(ValueError, match="unquantized"):
        AdapterMerger([quantized], torch.bfloat16)  # type: ignore[list-item]


@pytest.fixture(scope="module")
def reference(qwen3_lora_model: Path, adapters: dict[str, Path]) -> dict[tuple[str, int], list]:
    out = {}
    for name in (None, "alpha", "beta", "gamma"):
        for i, prompt in enumerate(PROMPTS):
            path = None if name is None else adapters[name]
            out[name or "base", i] = hf_lora_greedy(qwen3_lora_model, path, prompt, MAX_TOKENS)
    return out


def test_offline_tokens_weights_and_restore(
    qwen3_lora_model: Path,
    adapters: dict[str, Path],
    reference: dict[tuple[str, int], list],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Each adapter alone (merged), base requests between them (restored), then a batch
    mixing two adapters and base (LoRA kernels on the base weights): every answer equals
    PEFT. While merged each weight is ``W + B A`` from float32; after a base step it is the
    base weight bit for bit."""
    seen: dict[str, object] = {}
    checks: list[int] = []
    real_merge, real_restore = AdapterMerger.merge, AdapterMerger.restore

    def checked_merge(self: AdapterMerger, slot: int, lora_int_id: int) -> None:
        real_merge(self, slot, lora_int_id)
        seen["merger"] = self
        for layer, original in zip(self.layers, self.originals, strict=True):
            lora, offset = layer.lora, 0
            for i, size in enumerate(lora.slice_sizes):
                rows = slice(i * lora.max_rank, (i + 1) * lora.max_rank)
                delta = lora.lora_b[slot, offset : offset + size].float() @ lora.lora_a[slot, rows]
                want = (original[offset : offset + size].float() + delta).to(original.dtype)
                assert torch.allclose(layer.weight[offset : offset + size], want, atol=1e-6)
                offset += size
        checks.append(lora_int_id)

    def checked_restore(self: AdapterMerger) -> None:
        real_restore(self)
        pairs = zip(self.layers, self.originals, strict=True)
        assert all(torch.equal(layer.weight, w) for layer, w in pairs)
        checks.append(0)

    monkeypatch.setattr(AdapterMerger, "merge", checked_merge)
    monkeypatch.setattr(AdapterMerger, "restore", checked_restore)
    llm = LLM(
        str(qwen3_lora_model), device="cpu", dtype="float32", kv_cache_memory_bytes=4 << 20,
        enable_lora=True, max_loras=3, max_lora_rank=16, lora_merge_single_adapter=True,
    )  # fmt: skip
    params = SamplingParams(temperature=0.0, max_tokens=MAX_TOKENS, ignore_eos=True)
    loras = {n: LoRARequest(n, i + 1, str(adapters[n])) for i, n in enumerate(adapters)}
    for name in ("alpha", None, "gamma", "beta", None):
        outs = llm.generate(PROMPTS, params, use_tqdm=False, lora_request=loras.get(name or ""))
        got = [o.outputs[0].token_ids for o in outs]
        assert got == [reference[name or "base", i] for i in range(len(PROMPTS))], name
    assert [c for c in checks if c] == [1, 3, 2]  # alpha, gamma, beta merged in turn
    assert checks[-1] == 0  # and the base weights were back for the last base requests
    merger = seen["merger"]
    assert isinstance(merger, AdapterMerger) and merger.merges == 3
    assert merger.nbytes == sum(layer.weight.nbytes for layer in merger.layers)
    mixed = [loras["alpha"], None, loras["beta"]]
    outs = llm.generate(PROMPTS, params, use_tqdm=False, lora_request=mixed)
    want = [reference[n, i] for i, n in enumerate(("alpha", "base", "beta"))]
    assert [o.outputs[0].token_ids for o in outs] == want
    assert merger.merges == 3  # a mixed batch never merges


def test_offline_flag_without_enable_lora_is_refused(qwen3_lora_model: Path) -> None:
    with pytest.raises(StartupError, match="--lora-merge-single-adapter needs --enable-lora"):
        LLM(str(qwen3_lora_model), device="cpu", dtype="float32", lora_merge_single_adapter=True)


def test_flag_off_never_merges(qwen3_lora_model: Path, adapters: dict[str, Path], monkeypatch):
    built: list[object] = []
    monkeypatch.setattr(merge.AdapterMerger, "__init__", lambda *a: built.append(a))
    llm = LLM(
        str(qwen3_lora_model), device="cpu", dtype="float32", kv_cache_memory_bytes=4 << 20,
        enable_lora=True, max_lora_rank=16,
    )  # fmt: skip
    params = SamplingParams(temperature=0.0, max_tokens=3, ignore_eos=True)
    alpha = LoRARequest("alpha", 1, str(adapters["alpha"]))
    assert llm.generate(PROMPTS[:1], params, use_tqdm=False, lora_request=alpha)
    assert built == []
