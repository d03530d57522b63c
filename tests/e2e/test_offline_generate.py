"""End to end through ``LLM``: greedy parity with Hugging Face transformers under prefix
caching, chunked prefill and preemption; prompt logprobs; seeds; n > 1; stop strings;
a shared system prompt computed once. CPU, tiny random models."""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import pytest
import torch
from engine import LLM, SamplingParams
from engine_sdk.testing.models import build_tiny_model

ARCHS = ["Qwen3ForCausalLM", "LlamaForCausalLM"]
PROMPTS = [
    "Hello world! How are you today?",
    "The quick brown fox",
    "Café 東京 😀 and the capital of France is Paris, and Berlin is the capital of Germany.",
    "A",
    "Numbers: 0 1 2 3 4 5 6 7 8 9 10 42",
]
NUM_NEW = 12
BASE = {"device": "cpu", "dtype": "float32", "block_size": 4}


@pytest.fixture(scope="module")
def model_dirs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    return {a: build_tiny_model(tmp_path_factory.mktemp(a), a) for a in ARCHS}


@pytest.fixture(scope="module")
def hf_refs(model_dirs: dict[str, Path]) -> dict[str, Any]:
    """Per architecture: the HF model, tokenizer and greedy continuations of PROMPTS."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    refs = {}
    for arch, path in model_dirs.items():
        model = AutoModelForCausalLM.from_pretrained(str(path), dtype=torch.float32).eval()
        model.generation_config.eos_token_id = None  # exactly max_new_tokens tokens
        tok = AutoTokenizer.from_pretrained(str(path))
        greedy = []
        for text in PROMPTS:
            ids = torch.tensor([tok.encode(text)])
            with torch.no_grad():
                out = model.generate(
                    ids,
                    attention_mask=torch.ones_like(ids),
                    max_new_tokens=NUM_NEW,
                    do_sample=False,
                    pad_token_id=0,
                )
            greedy.append(out[0, ids.shape[1] :].tolist())
        assert len({tuple(g) for g in greedy}) > 1
        refs[arch] = {"model": model, "tokenizer": tok, "greedy": greedy}
    return refs


def _greedy(num: int = NUM_NEW) -> SamplingParams:
    return SamplingParams(temperature=0.0, max_tokens=num, ignore_eos=True)


def _token_ids(outs: list[Any]) -> list[list[int]]:
    return [o.outputs[0].token_ids for o in outs]


@pytest.mark.parametrize("arch", ARCHS)
def test_greedy_matches_hf_with_prefix_caching(arch: str, model_dirs: dict, hf_refs: dict) -> None:
    llm = LLM(str(model_dirs[arch]), kv_cache_memory_bytes=1 << 20, **BASE)
    outs = llm.generate(PROMPTS, _greedy(), use_tqdm=False)
    assert _token_ids(outs) == hf_refs[arch]["greedy"]
    tok = hf_refs[arch]["tokenizer"]
    for o in outs:  # text is the detokenized tokens
        assert o.outputs[0].text == tok.decode(o.outputs[0].token_ids, skip_special_tokens=True)
    # Second pass: every prompt's full blocks now come from the prefix cache.
    before = llm.stats().prefix_cache_hits
    again = llm.generate(PROMPTS, _greedy(), use_tqdm=False)
    assert _token_ids(again) == hf_refs[arch]["greedy"]
    assert llm.stats().prefix_cache_hits > before
    assert sum(o.num_cached_tokens for o in again) > 0


@pytest.mark.parametrize("async_scheduling", [True, False], ids=["async", "sync"])
@pytest.mark.parametrize("arch", ARCHS)
def test_greedy_matches_hf_with_chunked_prefill(
    arch: str, async_scheduling: bool, model_dirs: dict, hf_refs: dict
) -> None:
    llm = LLM(
        str(model_dirs[arch]),
        async_scheduling=async_scheduling,
        kv_cache_memory_bytes=1 << 20,
        max_num_batched_tokens=16,
        max_num_seqs=4,
        enable_prefix_caching=False,
        **BASE,
    )
    tok = hf_refs[arch]["tokenizer"]
    assert max(len(tok.encode(p)) for p in PROMPTS) > 16  # some prompt needs 2+ chunks
    outs = llm.generate(PROMPTS, _greedy(), use_tqdm=False)
    assert _token_ids(outs) == hf_refs[arch]["greedy"]


def _tiny_pool_bytes(model_dir: Path, num_blocks: int) -> int:
    probe = LLM(str(model_dir), kv_cache_memory_bytes=1 << 20, max_model_len=64, **BASE)
    per_block = probe.engine.runner.bytes_per_block
    return int(per_block() if callable(per_block) else per_block) * num_blocks


@pytest.mark.parametrize("async_scheduling", [True, False], ids=["async", "sync"])
@pytest.mark.parametrize("arch", ARCHS)
def test_greedy_matches_hf_under_preemption(
    arch: str, async_scheduling: bool, model_dirs: dict, hf_refs: dict
) -> None:
    path = model_dirs[arch]
    # 17 blocks of 4 tokens (16 usable: block 0 is reserved) for ten sequences of up to
    # ~45 tokens each: running sequences run out of blocks while decoding, so the
    # scheduler must preempt and recompute. Prefix caching off: duplicates share nothing.
    llm = LLM(
        str(path),
        kv_cache_memory_bytes=_tiny_pool_bytes(path, 17),
        async_scheduling=async_scheduling,
        max_model_len=64,
        enable_prefix_caching=False,
        **BASE,
    )
    assert llm.stats().num_total_blocks <= 16
    outs = llm.generate(PROMPTS * 2, _greedy(), use_tqdm=False)
    assert llm.stats().num_preemptions > 0
    assert llm.counters().num_preemptions > 0
    assert _token_ids(outs) == hf_refs[arch]["greedy"] * 2
    s = llm.stats()
    assert s.num_free_blocks == s.num_total_blocks


@pytest.mark.parametrize("arch", ARCHS)
def test_prompt_logprobs_match_hf(arch: str, model_dirs: dict, hf_refs: dict) -> None:
    llm = LLM(str(model_dirs[arch]), kv_cache_memory_bytes=1 << 20, **BASE)
    model, tok = hf_refs[arch]["model"], hf_refs[arch]["tokenizer"]
    params = SamplingParams(temperature=0.0, max_tokens=1, prompt_logprobs=3, logprobs=2)
    outs = llm.generate(PROMPTS[:3], params, use_tqdm=False)
    for text, out in zip(PROMPTS[:3], outs, strict=True):
        ids = tok.encode(text)
        with torch.no_grad():
            ref = torch.log_softmax(model(torch.tensor([ids])).logits[0].float(), dim=-1)
        plp = out.prompt_logprobs
        assert plp is not None and len(plp) == len(ids) and plp[0] is None
        for pos in range(1, len(ids)):
            entry = plp[pos]
            assert entry is not None and entry.token_id == ids[pos]
            assert math.isclose(entry.logprob, ref[pos - 1, ids[pos]].item(), abs_tol=1e-4)
            top = torch.topk(ref[pos - 1], 3)
            assert entry.top_token_ids == top.indices.tolist()
            assert entry.top_logprobs == pytest.approx(top.values.tolist(), abs=1e-4)
        # The sampled token's logprob too (greedy: rank 1).
        lp = out.outputs[0].logprobs
        assert lp is not None and len(lp) == 1 and lp[0].rank == 1
        assert math.isclose(lp[0].logprob, ref[-1].max().item(), abs_tol=1e-4)


def test_seeded_sampling_reproduces_and_n_samples_differ(model_dirs: dict) -> None:
    llm = LLM(str(model_dirs["Qwen3ForCausalLM"]), kv_cache_memory_bytes=1 << 20, **BASE)
    p = SamplingParams(temperature=1.0, max_tokens=10, seed=123, ignore_eos=True, n=3)
    first = llm.generate(PROMPTS[:2], p, use_tqdm=False)
    again = llm.generate(PROMPTS[:2], p, use_tqdm=False)
    for a, b in zip(first, again, strict=True):
        assert [c.token_ids for c in a.outputs] == [c.token_ids for c in b.outputs]
        assert len({tuple(c.token_ids) for c in a.outputs}) == 3  # the n samples differ
        assert [c.index for c in a.outputs] == [0, 1, 2]
    # Child i has seed + i: the n=1 request with seed 124 is child 1 of seed 123.
    single = llm.generate(PROMPTS[0], p.clone(n=1, seed=124), use_tqdm=False)
    assert single[0].outputs[0].token_ids == first[0].outputs[1].token_ids
    other = llm.generate(PROMPTS[:2], p.clone(seed=7), use_tqdm=False)
    assert [c.token_ids for c in other[0].outputs] != [c.token_ids for c in first[0].outputs]


def test_stop_strings_never_appear(model_dirs: dict, hf_refs: dict) -> None:
    llm = LLM(str(model_dirs["Qwen3ForCausalLM"]), kv_cache_memory_bytes=1 << 20, **BASE)
    tok = hf_refs["Qwen3ForCausalLM"]["tokenizer"]
    free = llm.generate(PROMPTS, _greedy(), use_tqdm=False)
    checked = 0
    for prompt, out in zip(PROMPTS, free, strict=True):
        text = out.outputs[0].text
        ids = out.outputs[0].token_ids
        # A stop string spanning a token boundary: two chars before it, one after.
        for k in range(2, len(ids) - 1):
            head = tok.decode(ids[:k], skip_special_tokens=True)
            stop = text[len(head) - 2 : len(head) + 1]
            ok = len(head) >= 2 and text.startswith(head) and len(stop) == 3
            if ok and "\ufffd" not in stop:
                break
        else:
            continue
        assert text.startswith(head)
        expected = text[: text.index(stop)]
        comp = llm.generate(prompt, _greedy().clone(stop=[stop]))[0].outputs[0]
        assert comp.finish_reason == "stop" and comp.stop_reason == stop
        assert stop not in comp.text and comp.text == expected
        inc = llm.generate(
            prompt,
            _greedy().clone(stop=[stop], include_stop_str_in_output=True),
            use_tqdm=False,
        )[0].outputs[0]
        assert inc.text == expected + stop
        checked += 1
    assert checked >= 2


def test_shared_system_prompt_is_computed_once(model_dirs: dict, hf_refs: dict) -> None:
    llm = LLM(str(model_dirs["Qwen3ForCausalLM"]), kv_cache_memory_bytes=1 << 20, **BASE)
    system = {"role": "system", "content": "You are a helpful assistant. " * 4}
    convs = [[system, {"role": "user", "content": q}] for q in ("Hi", "What is 2+2?", "Bye")]
    tok = hf_refs["Qwen3ForCausalLM"]["tokenizer"]
    prefix = tok.apply_chat_template([system], tokenize=False)
    num_prefix_blocks = len(tok.encode(prefix, add_special_tokens=False)) // 4
    assert num_prefix_blocks >= 5
    outs = llm.chat(convs[:1], _greedy(4), use_tqdm=False)
    assert outs[0].num_cached_tokens == 0
    hits_before = llm.stats().prefix_cache_hits
    outs = llm.chat(convs[1:], _greedy(4), use_tqdm=False)
    for o in outs:
        assert o.num_cached_tokens >= num_prefix_blocks * 4
    assert llm.stats().prefix_cache_hits - hits_before >= 2 * num_prefix_blocks * 4
    # And the cached prefix does not change the result.
    fresh = LLM(
        str(model_dirs["Qwen3ForCausalLM"]),
        kv_cache_memory_bytes=1 << 20,
        enable_prefix_caching=False,
        **BASE,
    )
    assert _token_ids(fresh.chat(convs[1:], _greedy(4), use_tqdm=False)) == _token_ids(outs)


def test_generation_config_defaults_from_the_model(tmp_path: Path) -> None:
    path = build_tiny_model(
        tmp_path / "m",
        "Qwen3ForCausalLM",
        generation_config={"temperature": 0.25, "top_k": 7, "max_new_tokens": 5, "eos_token_id": 3},
    )
    llm = LLM(str(path), kv_cache_memory_bytes=1 << 20, **BASE)
    d = llm.default_sampling_params()
    assert (d.temperature, d.top_k, d.max_tokens) == (0.25, 7, 5)
    out = llm.generate("hello", use_tqdm=False)[0]
    assert len(out.outputs[0].token_ids) <= 5
    eos_ids = llm.engine.input_processor.eos_token_ids
    assert 3 in eos_ids and llm.get_tokenizer().eos_token_id in eos_ids
    neutral = LLM(
        str(path),
        kv_cache_memory_bytes=1 << 20,
        generation_config="vllm",
        override_generation_config={"top_p": 0.5},
        **BASE,
    )
    n = neutral.default_sampling_params()
    assert (n.temperature, n.top_k, n.top_p, n.max_tokens) == (1.0, 0, 0.5, 16)


def test_discarded_llm_frees_its_model(model_dirs: dict[str, Path]) -> None:
    """``del llm; gc.collect()`` frees the weights, even though the engine gc-froze its
    startup objects (a second LLM in the same process must not find the first's memory)."""
    import gc
    import weakref

    llm = LLM(str(model_dirs["Qwen3ForCausalLM"]), kv_cache_memory_bytes=1 << 20, **BASE)
    model = weakref.ref(llm.engine.runner.model)
    assert llm.generate("hi", SamplingParams(max_tokens=2), use_tqdm=False)
    del llm
    gc.collect()
    assert model() is None
