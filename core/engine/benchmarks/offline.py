"""Offline benchmarks through the ``LLM`` class: throughput and one-batch latency."""

from __future__ import annotations

import time
from typing import Any

from engine.benchmarks.datasets import BenchRequest
from engine.benchmarks.report import percentiles


def _params(output_len: int, temperature: float) -> Any:
    from engine.sampling_params import SamplingParams

    return SamplingParams(
        temperature=temperature, top_p=1.0, max_tokens=output_len, ignore_eos=True
    )


def run_throughput(llm: Any, requests: list[BenchRequest], temperature: float) -> dict[str, Any]:
    """Generate every request in one ``generate`` call; tokens per second of wall time."""
    prompts = [{"prompt_token_ids": r.prompt_token_ids} for r in requests]
    params = [_params(r.output_len, temperature) for r in requests]
    start = time.perf_counter()
    outputs = llm.generate(prompts, params, use_tqdm=True)
    elapsed = time.perf_counter() - start
    num_out = sum(len(o.outputs[0].token_ids) for o in outputs)
    num_in = sum(len(r.prompt_token_ids) for r in requests)
    expected = sum(r.output_len for r in requests)
    if num_out != expected:
        raise RuntimeError(f"expected {expected} output tokens (ignore_eos), got {num_out}")
    return {
        "num_requests": len(requests),
        "elapsed_s": elapsed,
        "prompt_tokens": num_in,
        "output_tokens": num_out,
        "requests_per_s": len(requests) / elapsed,
        "output_tokens_per_s": num_out / elapsed,
        "total_tokens_per_s": (num_in + num_out) / elapsed,
    }


def run_latency(
    llm: Any,
    batch: list[BenchRequest],
    num_iters: int,
    num_warmup: int,
    temperature: float,
) -> dict[str, Any]:
    """Time the same batch ``num_iters`` times after ``num_warmup`` untimed runs."""
    prompts = [{"prompt_token_ids": r.prompt_token_ids} for r in batch]
    params = [_params(r.output_len, temperature) for r in batch]
    for _ in range(num_warmup):
        llm.generate(prompts, params, use_tqdm=False)
    latencies = []
    for _ in range(num_iters):
        start = time.perf_counter()
        llm.generate(prompts, params, use_tqdm=False)
        latencies.append(time.perf_counter() - start)
    stats = percentiles(latencies)
    output_len = batch[0].output_len
    return {
        "batch_size": len(batch),
        "input_len": len(batch[0].prompt_token_ids),
        "output_len": output_len,
        "num_iters": num_iters,
        "latency_s": stats,
        # Per output token of one sequence (includes the prefill, amortised).
        "ms_per_output_token": 1000 * stats["p50"] / output_len,
    }
