"""Quantized tiny models end to end through ``LLM``: fp8, compressed-tensors float8 and
AutoAWQ GEMM checkpoints, and online ``quantization="fp8"``, against Hugging Face
transformers running the same model with the dequantized weights.

Stated tolerance: greedy tokens identical; prompt log-probabilities within 1e-3 (both sides
compute in float32 on the CPU from the same dequantized weights; the difference is matmul
summation order). Each checkpoint is also checked to really differ from the unquantized
model, so a plugin that ignored the scales or the packing could not pass.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import torch
from engine import LLM, SamplingParams
from engine.errors import StartupError
from engine_sdk.testing.models import build_tiny_model
from quant_formats import (
    online_fp8_reference,
    write_awq,
    write_bf16,
    write_compressed_tensors,
    write_fp8,
    write_reference,
)

PROMPTS = [
    "Hello world! How are you today?",
    "The quick brown fox",
    "Café 東京 😀 and the capital of France is Paris.",
]
NUM_NEW = 10
BASE: dict[str, Any] = {"device": "cpu", "dtype": "float32", "block_size": 4}
LOGPROB_TOL = 1e-3

FORMATS: dict[str, Callable[[Path, Path], dict]] = {
    "fp8": lambda src, dst: write_fp8(src, dst),
    "fp8_static": lambda src, dst: write_fp8(src, dst, static=True),
    "fp8_block": lambda src, dst: write_fp8(src, dst, block=(32, 48)),
    "compressed_tensors": write_compressed_tensors,
    "awq": lambda src, dst: write_awq(src, dst, group_size=32),
}
CASES = [("Qwen3ForCausalLM", f) for f in FORMATS] + [
    ("LlamaForCausalLM", "awq"),
    ("LlamaForCausalLM", "compressed_tensors"),
]


@pytest.fixture(scope="module")
def tiny_models(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    archs = {arch for arch, _ in CASES}
    return {a: build_tiny_model(tmp_path_factory.mktemp(a), a, seed=3) for a in archs}


def _hf_reference(ref_dir: Path) -> tuple[Any, Any]:
    from transformers import AutoModelForCausalLM, AutoTokenizer

    model = AutoModelForCausalLM.from_pretrained(str(ref_dir), dtype=torch.float32).eval()
    model.generation_config.eos_token_id = None
    return model, AutoTokenizer.from_pretrained(str(ref_dir))


def _hf_greedy(model: Any, ids: list[int]) -> list[int]:
    x = torch.tensor([ids])
    with torch.no_grad():
        out = model.generate(
            x,
            attention_mask=torch.ones_like(x),
            max_new_tokens=NUM_NEW,
            do_sample=False,
            pad_token_id=0,
        )
    return out[0, len(ids) :].tolist()


def _hf_logprobs(model: Any, ids: list[int]) -> torch.Tensor:
    with torch.no_grad():
        return torch.log_softmax(model(torch.tensor([ids])).logits[0].float(), dim=-1)


def _assert_matches_reference(llm: LLM, ref_dir: Path, original_dir: Path) -> None:
    model, tok = _hf_reference(ref_dir)
    original, _ = _hf_reference(original_dir)
    greedy = SamplingParams(temperature=0.0, max_tokens=NUM_NEW, ignore_eos=True)
    outs = llm.generate(PROMPTS, greedy, use_tqdm=False)
    for text, out in zip(PROMPTS, outs, strict=True):
        assert out.outputs[0].token_ids == _hf_greedy(model, tok.encode(text)), text
    scored = SamplingParams(temperature=0.0, max_tokens=1, prompt_logprobs=0)
    max_err, max_quant_effect = 0.0, 0.0
    for text, out in zip(PROMPTS, llm.generate(PROMPTS, scored, use_tqdm=False), strict=True):
        ids = tok.encode(text)
        ref, unquantized = _hf_logprobs(model, ids), _hf_logprobs(original, ids)
        assert out.prompt_logprobs is not None
        for pos in range(1, len(ids)):
            entry = out.prompt_logprobs[pos]
            assert entry is not None and entry.token_id == ids[pos]
            max_err = max(max_err, abs(entry.logprob - ref[pos - 1, ids[pos]].item()))
        max_quant_effect = max(max_quant_effect, (ref - unquantized).abs().max().item())
    assert max_err <= LOGPROB_TOL, f"prompt logprobs differ from the reference by {max_err:.2e}"
    # The reference really is quantized: it is measurably off the float model, far more
    # than the engine is off the reference.
    assert max_quant_effect > 10 * max(max_err, 1e-5), (max_quant_effect, max_err)


@pytest.mark.parametrize(("arch", "fmt"), CASES, ids=lambda v: str(v))
def test_quantized_checkpoint_matches_dequantized_reference(
    arch: str, fmt: str, tiny_models: dict[str, Path], tmp_path: Path
) -> None:
    src = tiny_models[arch]
    quant_dir = tmp_path / fmt
    dequantized = FORMATS[fmt](src, quant_dir)
    ref_dir = write_reference(src, tmp_path / "reference", dequantized)
    llm = LLM(str(quant_dir), kv_cache_memory_bytes=1 << 20, **BASE)
    _assert_matches_reference(llm, ref_dir, src)


def test_awq_with_explicit_plugin(tiny_models: dict[str, Path], tmp_path: Path) -> None:
    """``--plugin awq`` (plugins=["awq"]) loads the same checkpoint; ``no:awq`` refuses it."""
    src = tiny_models["Qwen3ForCausalLM"]
    dequantized = write_awq(src, tmp_path / "awq", group_size=32)
    ref_dir = write_reference(src, tmp_path / "reference", dequantized)
    llm = LLM(str(tmp_path / "awq"), kv_cache_memory_bytes=1 << 20, plugins=["awq"], **BASE)
    _assert_matches_reference(llm, ref_dir, src)
    with pytest.raises(Exception, match="awq"):
        LLM(str(tmp_path / "awq"), kv_cache_memory_bytes=1 << 20, plugins=["no:awq"], **BASE)


def test_online_fp8_matches_dequantized_reference(
    tiny_models: dict[str, Path], tmp_path: Path
) -> None:
    src = tiny_models["Qwen3ForCausalLM"]
    bf16_dir = write_bf16(src, tmp_path / "bf16")
    ref_dir = write_reference(src, tmp_path / "reference", online_fp8_reference(bf16_dir))
    llm = LLM(str(bf16_dir), kv_cache_memory_bytes=1 << 20, quantization="fp8", **BASE)
    _assert_matches_reference(llm, ref_dir, bf16_dir)


def test_quantization_flag_conflicting_with_checkpoint(
    tiny_models: dict[str, Path], tmp_path: Path
) -> None:
    src = tiny_models["Qwen3ForCausalLM"]
    write_awq(src, tmp_path / "awq", group_size=32)
    with pytest.raises(Exception, match="conflicts with the checkpoint's quant_method 'awq'"):
        LLM(str(tmp_path / "awq"), kv_cache_memory_bytes=1 << 20, quantization="fp8", **BASE)
    with pytest.raises(StartupError, match="AutoAWQ checkpoint"):
        LLM(str(src), kv_cache_memory_bytes=1 << 20, quantization="awq", **BASE)
