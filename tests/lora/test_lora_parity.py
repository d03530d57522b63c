"""Greedy tokens with LoRA adapters equal transformers + PEFT with the adapter merged, on a
tiny random Qwen3 (merged q/k/v and gate/up projections, adapters of ranks 4/8/16, one
targeting q/v only), alone and in one batch that mixes three adapters and the base model."""

from __future__ import annotations

from pathlib import Path

import pytest
from engine import LLM, LoRARequest, SamplingParams
from lora_builders import hf_lora_greedy

PROMPTS = [[5, 17, 42, 99, 7], [3, 3, 8, 120, 64, 11, 2], [200, 1, 77], [9, 8, 7, 6, 5, 4]]
MAX_TOKENS = 8


def _llm(model: Path, **kwargs: object) -> LLM:
    base = {"device": "cpu", "dtype": "float32", "kv_cache_memory_bytes": 4 << 20}
    return LLM(str(model), **{**base, **kwargs})


@pytest.fixture(scope="module")
def reference(
    qwen3_lora_model: Path, adapters: dict[str, Path]
) -> dict[tuple[str, int], list[int]]:
    out = {}
    for name in (None, *adapters):
        for i, prompt in enumerate(PROMPTS):
            path = None if name is None else adapters[name]
            out[name or "base", i] = hf_lora_greedy(qwen3_lora_model, path, prompt, MAX_TOKENS)
    return out


def test_adapters_change_the_tokens(reference: dict[tuple[str, int], list[int]]) -> None:
    """The test can fail: every adapter changes some prompt's greedy tokens."""
    for name in ("alpha", "beta", "gamma"):
        assert any(reference[name, i] != reference["base", i] for i in range(len(PROMPTS))), name


def test_one_adapter_matches_peft(qwen3_lora_model, adapters, reference) -> None:
    llm = _llm(qwen3_lora_model, enable_lora=True, max_lora_rank=16)
    params = SamplingParams(temperature=0.0, max_tokens=MAX_TOKENS, ignore_eos=True)
    lora = LoRARequest("alpha", 1, str(adapters["alpha"]))
    outs = llm.generate(PROMPTS, params, use_tqdm=False, lora_request=lora)
    assert [o.outputs[0].token_ids for o in outs] == [reference["alpha", i] for i in range(4)]


@pytest.mark.parametrize("dense", [False, True], ids=["kernels-or-reference", "dense"])
def test_mixed_batch_of_three_adapters_and_base(
    qwen3_lora_model, adapters, reference, dense, monkeypatch
) -> None:
    """``dense``: every step through the many-token path (``lora_dense``), as prefill
    chunks and large decode batches take it on a GPU."""
    calls = []
    if dense:
        from engine_sdk.layers import lora, lora_dense

        def counted(x, *args):
            calls.append(x.shape[0])
            lora_dense.lora_apply_dense(x, *args)

        monkeypatch.setattr(lora, "lora_apply_dense", counted)
        monkeypatch.setattr(lora_dense, "DENSE_ON_CPU", True)
        monkeypatch.setattr(lora_dense, "DENSE_MIN_TOKENS", 1)
    llm = _llm(qwen3_lora_model, enable_lora=True, max_loras=3, max_lora_rank=16)
    params = SamplingParams(temperature=0.0, max_tokens=MAX_TOKENS, ignore_eos=True)
    loras = {
        name: LoRARequest(name, i + 1, str(path)) for i, (name, path) in enumerate(adapters.items())
    }
    names = [None, "alpha", "beta", "gamma"]
    prompts, requests, keys = [], [], []
    for i in range(len(PROMPTS)):
        for j, name in enumerate(names):
            prompts.append(PROMPTS[(i + j) % len(PROMPTS)])
            requests.append(None if name is None else loras[name])
            keys.append((name or "base", (i + j) % len(PROMPTS)))
    outs = llm.generate(prompts, params, use_tqdm=False, lora_request=requests)
    got = [o.outputs[0].token_ids for o in outs]
    assert got == [reference[k] for k in keys]
    assert bool(calls) == dense


def test_fewer_slots_than_adapters_queue_and_still_match(qwen3_lora_model, adapters, reference):
    """max_loras=1: the three adapters take turns in the one slot; every answer is right."""
    llm = _llm(qwen3_lora_model, enable_lora=True, max_loras=1, max_cpu_loras=2)
    params = SamplingParams(temperature=0.0, max_tokens=MAX_TOKENS, ignore_eos=True)
    loras = [LoRARequest(n, i + 1, str(p)) for i, (n, p) in enumerate(adapters.items())]
    requests = [loras[i % 3] for i in range(6)] + [None]
    prompts = [PROMPTS[i % 4] for i in range(7)]
    outs = llm.generate(prompts, params, use_tqdm=False, lora_request=requests)
    want = [reference[r.lora_name if r else "base", i % 4] for i, r in enumerate(requests)]
    assert [o.outputs[0].token_ids for o in outs] == want


def test_lora_request_without_enable_lora_is_refused(qwen3_lora_model, adapters) -> None:
    llm = _llm(qwen3_lora_model)
    with pytest.raises(ValueError, match="--enable-lora"):
        llm.generate(
            [PROMPTS[0]], use_tqdm=False, lora_request=LoRARequest("a", 1, str(adapters["alpha"]))
        )


def test_rank_above_max_lora_rank_names_the_flag(qwen3_lora_model, adapters) -> None:
    llm = _llm(qwen3_lora_model, enable_lora=True, max_lora_rank=8)
    with pytest.raises(ValueError, match=r"rank 16, above --max-lora-rank 8.*at least 16"):
        llm.generate(
            [PROMPTS[0]], use_tqdm=False, lora_request=LoRARequest("g", 3, str(adapters["gamma"]))
        )


def test_prefix_cache_is_per_adapter(qwen3_lora_model, adapters) -> None:
    """A 40-token prompt (two full 16-token blocks) run with alpha, beta, base, then alpha
    again: only the repeat hits the cache, and every answer matches PEFT."""
    llm = _llm(qwen3_lora_model, enable_lora=True, max_loras=2, max_lora_rank=16)
    params = SamplingParams(temperature=0.0, max_tokens=4, ignore_eos=True)
    prompt = [(7 * i + 3) % 300 + 1 for i in range(40)]
    alpha = LoRARequest("alpha", 1, str(adapters["alpha"]))
    beta = LoRARequest("beta", 2, str(adapters["beta"]))
    hits = []
    outs = []
    for lora in (alpha, beta, None, alpha):
        outs.append(llm.generate([prompt], params, use_tqdm=False, lora_request=lora)[0])
        hits.append(llm.stats().prefix_cache_hits)
    assert hits[:3] == [0, 0, 0] and hits[3] == 32
    for out, name in zip(outs, ("alpha", "beta", None, "alpha"), strict=True):
        path = None if name is None else adapters[name]
        assert out.outputs[0].token_ids == hf_lora_greedy(qwen3_lora_model, path, prompt, 4)


def test_chat_takes_a_lora_request(qwen3_lora_model, adapters) -> None:
    llm = _llm(qwen3_lora_model, enable_lora=True)
    params = SamplingParams(temperature=0.0, max_tokens=6, ignore_eos=True)
    conversation = [{"role": "user", "content": "Hello there"}]
    alpha = LoRARequest("alpha", 1, str(adapters["alpha"]))
    with_adapter = llm.chat(conversation, params, use_tqdm=False, lora_request=alpha)[0]
    base = llm.chat(conversation, params, use_tqdm=False)[0]
    prompt = list(with_adapter.prompt_token_ids)
    assert with_adapter.outputs[0].token_ids == hf_lora_greedy(
        qwen3_lora_model, adapters["alpha"], prompt, 6
    )
    assert base.outputs[0].token_ids == hf_lora_greedy(qwen3_lora_model, None, prompt, 6)


def test_adapter_for_modules_the_model_lacks_fails_its_request_only(
    qwen3_lora_model, adapters, tmp_path
) -> None:
    """Shapes fit but the module names are not the model's: refused when added (a clear
    error), never a failed step; the engine keeps serving."""
    import shutil

    from safetensors.torch import load_file, save_file

    folder = tmp_path / "renamed"
    shutil.copytree(adapters["beta"], folder)
    tensors = load_file(str(folder / "adapter_model.safetensors"))
    renamed = {k.replace(".model.layers.", ".model.decoder.layers."): v for k, v in tensors.items()}
    save_file(renamed, str(folder / "adapter_model.safetensors"))
    llm = _llm(qwen3_lora_model, enable_lora=True)
    params = SamplingParams(temperature=0.0, max_tokens=MAX_TOKENS, ignore_eos=True)
    bad = LoRARequest("renamed", 9, str(folder))
    with pytest.raises(ValueError, match="does not run as LoRA-capable projections"):
        llm.generate([PROMPTS[0]], params, use_tqdm=False, lora_request=bad)
    out = llm.generate([PROMPTS[0]], params, use_tqdm=False)
    assert out[0].outputs[0].token_ids == hf_lora_greedy(qwen3_lora_model, None, PROMPTS[0], 8)


def test_phi3_adapter_on_checkpoint_fused_projections(tmp_path) -> None:
    """Phi-3 fuses q/k/v and gate/up in its checkpoint; PEFT adapters then target
    ``qkv_proj`` / ``gate_up_proj`` (one A, B over the fused outputs)."""
    from engine_sdk.testing.models import build_tiny_model
    from lora_builders import build_adapter

    model = build_tiny_model(tmp_path / "phi3", "Phi3ForCausalLM", seed=5)
    adapter = build_adapter(
        model, tmp_path / "phi3-lora", 8, ["qkv_proj", "o_proj", "gate_up_proj", "down_proj"], 21
    )
    llm = _llm(model, enable_lora=True)
    params = SamplingParams(temperature=0.0, max_tokens=MAX_TOKENS, ignore_eos=True)
    lora = LoRARequest("phi", 1, str(adapter))
    outs = llm.generate(PROMPTS, params, use_tqdm=False, lora_request=[lora, None, lora, lora])
    want = [
        hf_lora_greedy(model, adapter if i != 1 else None, prompt, MAX_TOKENS)
        for i, prompt in enumerate(PROMPTS)
    ]
    assert [o.outputs[0].token_ids for o in outs] == want
    assert want[0] != hf_lora_greedy(model, None, PROMPTS[0], MAX_TOKENS)
