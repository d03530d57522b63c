"""On the GPU (marked ``gpu``): LoRA through the Triton kernels, eagerly and replayed in
CUDA graphs (with async scheduling), gives the greedy tokens of transformers + PEFT, for a
batch mixing three adapters and the base model (float32, so tokens compare exactly)."""

from __future__ import annotations

import gc
from pathlib import Path

import pytest
import torch
from engine import LLM, LoRARequest, SamplingParams
from lora_builders import hf_lora_greedy

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA"),
]


@pytest.fixture(autouse=True)
def _free_gpu_memory():
    """Memory that earlier tests of the process left in torch's cache (or an LLM not yet
    collected) counts as used when the engine sizes its KV cache: release it first (an H100
    run of round 11 had no room for KV blocks at --gpu-memory-utilization 0.2 here)."""
    gc.collect()
    torch.cuda.empty_cache()
    yield
    gc.collect()
    torch.cuda.empty_cache()


PROMPTS = [[5, 17, 42, 99, 7], [3, 3, 8, 120, 64, 11, 2], [200, 1, 77], [9, 8, 7, 6, 5, 4]]
# long enough for the blocked prefill kernels (128+ tokens in the step)
PROMPTS += [[(7 * i + j) % 300 + 1 for i in range(140)] for j in range(2)]


@pytest.mark.parametrize("enforce_eager", [True, False], ids=["eager", "cuda-graphs"])
def test_mixed_batch_matches_peft_on_cuda(qwen3_lora_model: Path, adapters, enforce_eager) -> None:
    llm = LLM(
        str(qwen3_lora_model), device="cuda", dtype="float32", enforce_eager=enforce_eager,
        enable_lora=True, max_loras=3, max_lora_rank=16, gpu_memory_utilization=0.2,
    )  # fmt: skip
    if not enforce_eager:
        graphs = llm.engine.runner.cuda_graphs
        assert graphs is not None and any(lora for _, lora in graphs.graphs)
    loras = {n: LoRARequest(n, i + 1, str(p)) for i, (n, p) in enumerate(adapters.items())}
    names = [None, "alpha", "beta", "gamma", "alpha", "gamma"]
    requests = [None if n is None else loras[n] for n in names]
    params = SamplingParams(temperature=0.0, max_tokens=8, ignore_eos=True)
    outs = llm.generate(PROMPTS, params, use_tqdm=False, lora_request=requests)
    want = [
        hf_lora_greedy(qwen3_lora_model, None if n is None else adapters[n], p, 8)
        for n, p in zip(names, PROMPTS, strict=True)
    ]
    assert [o.outputs[0].token_ids for o in outs] == want


def test_merged_adapter_in_cuda_graphs_matches_peft(qwen3_lora_model: Path, adapters) -> None:
    """``--lora-merge-single-adapter`` on the GPU: each adapter alone is merged into the
    weights and decodes in the base CUDA graphs (async scheduling on, the merge queued
    behind the step in flight), base requests between them run on the restored weights,
    and a mixed batch runs the LoRA kernels: every answer equals PEFT's."""
    llm = LLM(
        str(qwen3_lora_model), device="cuda", dtype="float32", enable_lora=True, max_loras=3,
        max_lora_rank=16, gpu_memory_utilization=0.2, lora_merge_single_adapter=True,
    )  # fmt: skip
    assert llm.engine.runner.cuda_graphs is not None
    loras = {n: LoRARequest(n, i + 1, str(p)) for i, (n, p) in enumerate(adapters.items())}
    params = SamplingParams(temperature=0.0, max_tokens=12, ignore_eos=True)
    prompts = PROMPTS[:3]
    for name in ("alpha", None, "gamma", "beta", None):
        outs = llm.generate(prompts, params, use_tqdm=False, lora_request=loras.get(name or ""))
        want = [
            hf_lora_greedy(qwen3_lora_model, None if name is None else adapters[name], p, 12)
            for p in prompts
        ]
        assert [o.outputs[0].token_ids for o in outs] == want, name
    merger = llm.engine.runner.lora.merger
    assert merger is not None and merger.merges == 3
    mixed = [loras["alpha"], None, loras["beta"]]
    outs = llm.generate(prompts, params, use_tqdm=False, lora_request=mixed)
    want = [
        hf_lora_greedy(qwen3_lora_model, None if n is None else adapters[n], p, 12)
        for n, p in zip(("alpha", None, "beta"), prompts, strict=True)
    ]
    assert [o.outputs[0].token_ids for o in outs] == want
    assert merger.merges == 3
