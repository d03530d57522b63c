"""The runner matches Hugging Face transformers: greedy tokens and float32 logits."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch
from engine.core.request import ReqId, Request
from engine.core.scheduler_output import ScheduledRequest, SchedulerOutput
from engine.sampling_params import SamplingParams
from engine_sdk.testing.models import build_tiny_model
from model_driver import GreedyDriver, hf_greedy, hf_model, make_runner

ARCHS = ["Qwen3ForCausalLM", "LlamaForCausalLM"]
PROMPTS = [
    "Hello world! How are you today?",
    "The quick brown fox",
    "Café 東京 😀 and the capital of France is Paris, and Berlin is the capital of Germany.",
    "A",
]


def _encode(model_dir: Path, texts: list[str]) -> list[list[int]]:
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(str(model_dir))
    return [tok.encode(t) for t in texts]


def _full_prompt_logits(runner: Any, prompt: list[int]) -> torch.Tensor:
    """Logits at every prompt position from one prefill step (prompt_logprobs rows)."""
    req = Request(ReqId("logits"), prompt, SamplingParams(temperature=0, prompt_logprobs=0))
    blocks = list(range(-(-len(prompt) // runner.block_size)))
    so = SchedulerOutput([ScheduledRequest(req.req_id, prompt, 0, blocks, True, req)], len(prompt))
    with torch.inference_mode():
        inputs = runner.prepare_inputs(so)
        return runner.run_model(inputs, runner.kv_caches)


@pytest.mark.parametrize("arch", ARCHS)
def test_greedy_batch_of_mixed_lengths_matches_hf(arch: str, pm: Any, model_dirs: dict) -> None:
    model_dir = model_dirs[arch]
    prompts = _encode(model_dir, PROMPTS)
    runner = make_runner(pm, model_dir)
    driver = GreedyDriver(runner)
    requests = [driver.new_request(f"r{i}", p, max_tokens=12) for i, p in enumerate(prompts)]
    got = driver.run(requests)
    hf = hf_model(model_dir)
    want = [hf_greedy(hf, p, 12) for p in prompts]
    assert got == want
    assert len({tuple(w) for w in want}) > 1  # the prompts really lead to different outputs


@pytest.mark.parametrize("arch", ARCHS)
def test_chunked_prefill_and_cached_prefix_match_hf(arch: str, pm: Any, model_dirs: dict) -> None:
    model_dir = model_dirs[arch]
    long_prompt = _encode(model_dir, [PROMPTS[2]])[0]
    assert len(long_prompt) > 20
    shared = long_prompt[:16]  # 4 full blocks of 4 tokens
    second = shared + _encode(model_dir, [" The weather is sunny"])[0]
    runner = make_runner(pm, model_dir)
    driver = GreedyDriver(runner)
    # Chunks of 7 tokens: the prompt spans several steps, unaligned with the blocks.
    first = driver.new_request("chunked", long_prompt, max_tokens=8, chunk_size=7)
    driver.run([first])
    assert driver.steps >= 4 + 8 - 1
    # The second request reuses the first's 4 prompt blocks and computes only the rest,
    # alongside a fresh request in the same steps.
    reuse = driver.new_request("reuse", second, 8, prefix_from=first, num_prefix_blocks=4)
    fresh = driver.new_request("fresh", _encode(model_dir, [PROMPTS[1]])[0], 8, chunk_size=3)
    driver.run([reuse, fresh])
    hf = hf_model(model_dir)
    assert first.outputs == hf_greedy(hf, long_prompt, 8)
    assert reuse.outputs == hf_greedy(hf, second, 8)
    assert fresh.outputs == hf_greedy(hf, _encode(model_dir, [PROMPTS[1]])[0], 8)


def test_cached_prefix_is_really_read_from_the_cache(pm: Any, qwen3_dir: Path) -> None:
    """Corrupting the shared blocks changes the reusing request's tokens."""
    prompt = _encode(qwen3_dir, [PROMPTS[2]])[0]
    runner = make_runner(pm, qwen3_dir)
    driver = GreedyDriver(runner)
    first = driver.new_request("a", prompt, max_tokens=1)
    driver.run([first])
    for cache in runner.kv_caches:
        cache[:, first.block_ids[:4]] = torch.randn_like(cache[:, first.block_ids[:4]]) * 5
    reuse = driver.new_request("b", prompt, 6, prefix_from=first, num_prefix_blocks=4)
    driver.run([reuse])
    assert reuse.outputs != hf_greedy(hf_model(qwen3_dir), prompt, 6)


@pytest.mark.parametrize("arch", ARCHS)
def test_float32_logits_match_hf(arch: str, pm: Any, model_dirs: dict) -> None:
    model_dir = model_dirs[arch]
    prompt = _encode(model_dir, [PROMPTS[2]])[0]
    runner = make_runner(pm, model_dir)
    ours = _full_prompt_logits(runner, prompt)
    with torch.no_grad():
        theirs = hf_model(model_dir)(torch.tensor([prompt])).logits[0].float()
    assert ours.dtype == torch.float32 and ours.shape == theirs.shape
    torch.testing.assert_close(ours, theirs, rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize(
    ("arch", "overrides"),
    [
        ("LlamaForCausalLM", {"tie_word_embeddings": True, "sharded": True}),
        ("Qwen3ForCausalLM", {"tie_word_embeddings": True}),
        ("Qwen3ForCausalLM", {"sharded": True}),
        (
            "LlamaForCausalLM",
            {
                "rope_scaling": {
                    "rope_type": "llama3",
                    "factor": 8.0,
                    "low_freq_factor": 1.0,
                    "high_freq_factor": 4.0,
                    "original_max_position_embeddings": 64,
                },
                "rope_theta": 500000.0,
            },
        ),
        ("LlamaForCausalLM", {"rope_scaling": {"rope_type": "linear", "factor": 2.0}}),
        (
            "Qwen3ForCausalLM",
            {
                "rope_scaling": {
                    "rope_type": "yarn",
                    "factor": 4.0,
                    "original_max_position_embeddings": 128,
                },
            },
        ),
        ("MistralForCausalLM", {"sliding_window": 8}),
        ("LlamaForCausalLM", {"attention_bias": True, "mlp_bias": True}),
    ],
    ids=[
        "llama-tied-sharded",
        "qwen3-tied",
        "qwen3-sharded",
        "llama3-rope",
        "linear-rope",
        "yarn-rope",
        "mistral-sliding-window",
        "llama-bias",
    ],
)
def test_checkpoint_variants_match_hf(arch: str, overrides: dict, pm: Any, tmp_path: Path) -> None:
    model_dir = build_tiny_model(tmp_path, arch, seed=3, **overrides)
    if overrides.get("sharded"):
        assert (model_dir / "model.safetensors.index.json").is_file()
        assert not (model_dir / "model.safetensors").exists()
    # Long enough to pass the llama3 original context (64) and the sliding window (8).
    prompt = _encode(model_dir, [PROMPTS[2] + " " + PROMPTS[0] + " " + PROMPTS[2]])[0]
    assert len(prompt) > 64
    runner = make_runner(pm, model_dir)
    if overrides.get("tie_word_embeddings"):
        assert runner.model.lm_head.weight is runner.model.model.embed_tokens.weight
    with torch.no_grad():
        theirs = hf_model(model_dir)(torch.tensor([prompt])).logits[0].float()
    torch.testing.assert_close(_full_prompt_logits(runner, prompt), theirs, rtol=1e-4, atol=1e-5)
    driver = GreedyDriver(runner)
    req = driver.new_request("r", prompt, max_tokens=6, chunk_size=16)
    driver.run([req])
    assert req.outputs == hf_greedy(hf_model(model_dir), prompt, 6)


def test_prompt_logprobs_follow_hf_log_softmax_across_chunks(pm: Any, qwen3_dir: Path) -> None:
    prompt = _encode(qwen3_dir, [PROMPTS[0]])[0]
    runner = make_runner(pm, qwen3_dir)
    driver = GreedyDriver(runner)
    req = driver.new_request("p", prompt, max_tokens=1, chunk_size=3, prompt_logprobs=2)
    collected = []
    while not req.outputs:
        collected += driver.step([req])["output"].prompt_logprobs.get(ReqId("p"), [])
    with torch.no_grad():
        logits = hf_model(qwen3_dir)(torch.tensor([prompt])).logits[0].float()
    expected = torch.log_softmax(logits, -1)
    assert [lp.token_id for lp in collected] == prompt[1:]
    for i, lp in enumerate(collected):
        assert lp.logprob == pytest.approx(expected[i, prompt[i + 1]].item(), abs=1e-4)
        assert len(lp.top_token_ids) == 2
        assert lp.top_token_ids[0] == int(expected[i].argmax())


@pytest.mark.parametrize("arch", ARCHS)
def test_bfloat16_runs_and_mostly_agrees(arch: str, pm: Any, model_dirs: dict) -> None:
    model_dir = model_dirs[arch]
    prompt = _encode(model_dir, [PROMPTS[0]])[0]
    runner = make_runner(pm, model_dir, dtype="bfloat16")
    assert runner.kv_caches[0].dtype == torch.bfloat16
    ours = _full_prompt_logits(runner, prompt)
    with torch.no_grad():
        theirs = hf_model(model_dir)(torch.tensor([prompt])).logits[0].float()
    assert (ours.argmax(-1) == theirs.argmax(-1)).float().mean() >= 0.8
    assert (ours - theirs).abs().max() < 0.15 * theirs.abs().max()


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
@pytest.mark.parametrize("arch", ARCHS)
def test_cuda_float32_greedy_matches_hf(arch: str, pm: Any, model_dirs: dict) -> None:
    model_dir = model_dirs[arch]
    prompts = _encode(model_dir, PROMPTS)
    runner = make_runner(pm, model_dir, device="cuda", block_size=16)
    assert runner.kv_caches[0].is_cuda
    driver = GreedyDriver(runner)
    requests = [
        driver.new_request(f"r{i}", p, max_tokens=10, chunk_size=5) for i, p in enumerate(prompts)
    ]
    got = driver.run(requests)
    hf = hf_model(model_dir)
    assert got == [hf_greedy(hf, p, 10) for p in prompts]
