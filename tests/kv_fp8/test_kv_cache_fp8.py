"""``kv_cache_dtype="fp8"`` end to end through ``LLM`` on the CPU (reference backend).

Checked: the same ``kv_cache_memory_bytes`` holds exactly 4x the blocks of a float32 cache
and 2x those of a bfloat16 one; the caches are float8_e4m3fn; prompt log-probabilities and
greedy tokens stay close to the ``auto`` run; checkpoint scales (``k_scale`` / ``v_scale``,
ModelOpt's ``k_proj.k_scale``, the older ``kv_scale``, per-head vectors) reach the layers
and change the result; bad values are refused naming the valid ones.

Stated tolerance (fp8 vs auto, float32 model): prompt logprobs within 0.2 at every position
and 0.05 on average. e4m3 keeps 3 mantissa bits (rounding up to 2^-4 relative); this tiny
random Qwen3 normalizes q and k (RMS ~1 per element), so attention logits move by O(0.1)
and the near-uniform next-token distributions of a random model follow. Measured: max 0.13,
mean 0.03 (bfloat16 weights and cache vs float32: max 0.03). Greedy tokens: random tiny
models have near-ties, so at least 2 of 3 prompts must match exactly over 12 tokens.
"""

from __future__ import annotations

import logging
import shutil
from pathlib import Path
from typing import Any

import pytest
import torch
from engine import LLM, SamplingParams
from engine_sdk.testing.models import build_tiny_model
from safetensors.torch import load_file, save_file

PROMPTS = [
    "Hello world! How are you today?",
    "The quick brown fox",
    "Café 東京 and the capital of France is Paris.",
]
NUM_NEW = 12
# float32, block size 4: 2 (K, V) x 2 layers x 4 tokens x 2 kv heads x 16 x 4 B = 2048 B.
FP32_BYTES_PER_BLOCK = 2048
KV_BYTES = 200 * FP32_BYTES_PER_BLOCK
BASE: dict[str, Any] = {"device": "cpu", "block_size": 4, "kv_cache_memory_bytes": KV_BYTES}
MAX_LOGPROB_DIFF = 0.2
MEAN_LOGPROB_DIFF = 0.05


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return build_tiny_model(tmp_path_factory.mktemp("qwen3"), "Qwen3ForCausalLM", seed=3)


def _prompt_logprobs(llm: LLM) -> torch.Tensor:
    scored = SamplingParams(temperature=0.0, max_tokens=1, prompt_logprobs=0)
    values = []
    for out in llm.generate(PROMPTS, scored, use_tqdm=False):
        assert out.prompt_logprobs is not None
        values += [entry.logprob for entry in out.prompt_logprobs[1:] if entry is not None]
    return torch.tensor(values, dtype=torch.float64)


def _greedy(llm: LLM) -> list[list[int]]:
    greedy = SamplingParams(temperature=0.0, max_tokens=NUM_NEW, ignore_eos=True)
    return [list(o.outputs[0].token_ids) for o in llm.generate(PROMPTS, greedy, use_tqdm=False)]


@pytest.fixture(scope="module")
def auto_run(model_dir: Path) -> tuple[LLM, torch.Tensor, list[list[int]]]:
    llm = LLM(str(model_dir), dtype="float32", kv_cache_dtype="auto", **BASE)
    return llm, _prompt_logprobs(llm), _greedy(llm)


def _with_scales(src: Path, dst: Path, scales: dict[str, torch.Tensor]) -> Path:
    """A copy of ``src`` whose safetensors file also holds ``scales``."""
    shutil.copytree(src, dst)
    state = load_file(str(dst / "model.safetensors"))
    state.update(scales)
    save_file(state, str(dst / "model.safetensors"), metadata={"format": "pt"})
    return dst


def _layer_scales(llm: LLM) -> list[float]:
    """[k_scale, v_scale] of every layer, flattened."""
    return [x for b in llm.engine.runner.attention_backends for x in b.kv_scales.tolist()]


def _scalar(value: float) -> torch.Tensor:
    return torch.tensor(value, dtype=torch.float32)


def test_fp8_cache_holds_4x_the_float32_blocks(
    model_dir: Path, auto_run: tuple[LLM, torch.Tensor, list[list[int]]], caplog: Any
) -> None:
    auto_llm = auto_run[0]
    with caplog.at_level(logging.INFO):
        llm = LLM(str(model_dir), dtype="float32", kv_cache_dtype="fp8", **BASE)
    auto_runner, runner = auto_llm.engine.runner, llm.engine.runner
    assert auto_runner.bytes_per_block == FP32_BYTES_PER_BLOCK
    assert runner.bytes_per_block == FP32_BYTES_PER_BLOCK // 4
    assert auto_runner.num_blocks == 200 and runner.num_blocks == 4 * 200
    assert llm.stats().num_total_blocks == 4 * auto_llm.stats().num_total_blocks + 3
    assert all(c.dtype == torch.float8_e4m3fn for c in runner.kv_caches)
    assert all(c.dtype == torch.float32 for c in auto_runner.kv_caches)
    assert "KV cache: 800 blocks x 4 tokens = 3200 tokens (400.00 KiB)" in caplog.text
    assert "KV cache dtype fp8 (float8_e4m3fn, 1 byte(s) per element)" in caplog.text
    assert "stored with scale 1.0" in caplog.text  # no scales in this checkpoint


def test_fp8_cache_holds_2x_the_bfloat16_blocks(model_dir: Path) -> None:
    auto = LLM(str(model_dir), dtype="bfloat16", kv_cache_dtype="auto", **BASE)
    fp8 = LLM(str(model_dir), dtype="bfloat16", kv_cache_dtype="fp8", **BASE)
    assert auto.engine.runner.num_blocks == 400
    assert fp8.engine.runner.num_blocks == 2 * 400
    assert fp8.engine.runner.kv_caches[0].element_size() == 1


def test_fp8_generation_stays_close_to_auto(
    model_dir: Path, auto_run: tuple[LLM, torch.Tensor, list[list[int]]]
) -> None:
    _, auto_logprobs, auto_tokens = auto_run
    llm = LLM(str(model_dir), dtype="float32", kv_cache_dtype="fp8", **BASE)
    diff = (_prompt_logprobs(llm) - auto_logprobs).abs()
    assert diff.max().item() <= MAX_LOGPROB_DIFF, diff.max().item()
    assert diff.mean().item() <= MEAN_LOGPROB_DIFF, diff.mean().item()
    assert diff.max().item() > 0  # the cache really is quantized
    tokens = _greedy(llm)
    assert sum(a == b for a, b in zip(tokens, auto_tokens, strict=True)) >= 2, tokens


def test_checkpoint_kv_scales_reach_every_layer(model_dir: Path, tmp_path: Path) -> None:
    prefix = "model.layers.{}.self_attn"
    scales = {
        f"{prefix.format(0)}.k_scale": _scalar(0.02),  # llm-compressor / vLLM
        f"{prefix.format(0)}.v_scale": _scalar(0.005),
        f"{prefix.format(1)}.k_proj.k_scale": _scalar(0.03),  # ModelOpt
        f"{prefix.format(1)}.v_proj.v_scale": torch.tensor([0.001, 0.004]),  # per head: max
    }
    ckpt = _with_scales(model_dir, tmp_path / "scaled", scales)
    llm = LLM(str(ckpt), dtype="float32", kv_cache_dtype="fp8", **BASE)
    assert _layer_scales(llm) == pytest.approx([0.02, 0.005, 0.03, 0.004])

    legacy = {f"{prefix.format(i)}.kv_scale": _scalar(0.01 * (i + 1)) for i in range(2)}
    ckpt = _with_scales(model_dir, tmp_path / "legacy", legacy)
    llm = LLM(str(ckpt), dtype="float32", kv_cache_dtype="fp8", **BASE)
    assert _layer_scales(llm) == pytest.approx([0.01, 0.01, 0.02, 0.02])


def test_checkpoint_kv_scales_are_applied(
    model_dir: Path, tmp_path: Path, auto_run: tuple[LLM, torch.Tensor, list[list[int]]]
) -> None:
    """Sane scales keep the tolerance; scales far too small clip K/V and break it."""
    _, auto_logprobs, _ = auto_run
    prefix = "model.layers.{}.self_attn"
    sane = {f"{prefix.format(i)}.{w}_scale": _scalar(0.01) for i in range(2) for w in "kv"}
    llm = LLM(
        str(_with_scales(model_dir, tmp_path / "sane", sane)),
        dtype="float32",
        kv_cache_dtype="fp8",
        **BASE,
    )
    diff = (_prompt_logprobs(llm) - auto_logprobs).abs()
    assert diff.max().item() <= MAX_LOGPROB_DIFF and diff.mean().item() <= MEAN_LOGPROB_DIFF
    # 448 * 1e-5 = 0.0045: nearly every K/V element clips.
    tiny = {f"{prefix.format(i)}.{w}_scale": _scalar(1e-5) for i in range(2) for w in "kv"}
    clipped_dir = _with_scales(model_dir, tmp_path / "tiny", tiny)
    clipped = LLM(str(clipped_dir), dtype="float32", kv_cache_dtype="fp8", **BASE)
    assert (_prompt_logprobs(clipped) - auto_logprobs).abs().max().item() > 2 * MAX_LOGPROB_DIFF
    # ... and the auto cache ignores checkpoint scales.
    auto = LLM(str(clipped_dir), dtype="float32", kv_cache_dtype="auto", **BASE)
    assert torch.allclose(_prompt_logprobs(auto), auto_logprobs, atol=1e-6)


def test_invalid_kv_cache_scales_are_refused(model_dir: Path, tmp_path: Path) -> None:
    bad = {"model.layers.0.self_attn.k_scale": _scalar(0.0)}
    with pytest.raises(Exception, match=r"k_scale.*positive finite"):
        LLM(str(_with_scales(model_dir, tmp_path / "zero", bad)), kv_cache_dtype="fp8", **BASE)
    stray = {"model.layers.7.self_attn.k_scale": _scalar(0.1)}
    with pytest.raises(Exception, match=r"model.layers.7.self_attn.k_scale.*no attention layer"):
        LLM(str(_with_scales(model_dir, tmp_path / "stray", stray)), kv_cache_dtype="fp8", **BASE)


def test_invalid_kv_cache_dtype_lists_the_valid_ones(model_dir: Path) -> None:
    with pytest.raises(Exception, match=r"--kv-cache-dtype 'int4'.*auto, fp8, fp8_e4m3, fp8_e5m2"):
        LLM(str(model_dir), kv_cache_dtype="int4", **BASE)


def test_fp8_e5m2_runs_on_the_reference_backend(model_dir: Path) -> None:
    llm = LLM(str(model_dir), dtype="float32", kv_cache_dtype="fp8_e5m2", **BASE)
    assert llm.engine.runner.kv_caches[0].dtype == torch.float8_e5m2
    assert len(_greedy(llm)[0]) == NUM_NEW
