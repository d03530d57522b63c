"""Serving benchmark: concurrent streaming requests against a running OpenAI-style server.

Each request streams ``/v1/completions`` with token-id prompts and ``ignore_eos``; the
client records time to first token (TTFT), the gaps between streamed chunks (ITL), time per
output token after the first (TPOT) and end-to-end latency.
"""

from __future__ import annotations

import asyncio
import json
import random
import time
from dataclasses import dataclass, field
from typing import Any

from engine.benchmarks.datasets import BenchRequest
from engine.benchmarks.report import percentiles


@dataclass
class RequestResult:
    ok: bool
    prompt_tokens: int = 0
    output_tokens: int = 0
    ttft: float = 0.0
    e2e: float = 0.0
    itls: list[float] = field(default_factory=list)
    error: str = ""


async def _one(
    client: Any, url: str, model: str, req: BenchRequest, headers: dict[str, str]
) -> RequestResult:
    body = {
        "model": model,
        "prompt": req.prompt_token_ids,
        "max_tokens": req.output_len,
        "ignore_eos": True,
        "temperature": 0.0,
        "stream": True,
        "stream_options": {"include_usage": True},
    }
    result = RequestResult(ok=False, prompt_tokens=len(req.prompt_token_ids))
    start = time.perf_counter()
    last = start
    try:
        async with client.stream("POST", url, json=body, headers=headers) as resp:
            if resp.status_code != 200:
                result.error = f"HTTP {resp.status_code}: {(await resp.aread())[:200]!r}"
                return result
            async for line in resp.aiter_lines():
                if not line.startswith("data: ") or line == "data: [DONE]":
                    continue
                chunk = json.loads(line[6:])
                now = time.perf_counter()
                if chunk.get("usage"):
                    result.output_tokens = chunk["usage"]["completion_tokens"]
                if chunk.get("choices"):
                    if result.ttft == 0.0:
                        result.ttft = now - start
                    else:
                        result.itls.append(now - last)
                    last = now
                if "error" in chunk:
                    result.error = str(chunk["error"])[:200]
                    return result
        result.e2e = time.perf_counter() - start
        result.ok = result.output_tokens == req.output_len
        if not result.ok:
            result.error = f"expected {req.output_len} tokens, got {result.output_tokens}"
    except Exception as exc:  # a benchmark reports failures, it does not stop on them
        result.error = f"{type(exc).__name__}: {exc}"
    return result


async def run_serving(
    base_url: str,
    model: str,
    requests: list[BenchRequest],
    max_concurrency: int | None,
    request_rate: float,
    api_key: str | None = None,
    seed: int = 0,
) -> dict[str, Any]:
    import httpx
    from tqdm import tqdm

    url = base_url.rstrip("/") + "/completions"
    headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
    limit = asyncio.Semaphore(max_concurrency or len(requests))
    rng = random.Random(seed)
    bar = tqdm(total=len(requests), desc="requests")
    timeout = httpx.Timeout(None, connect=30.0)
    limits = httpx.Limits(max_connections=max_concurrency or len(requests) or 1)

    async with httpx.AsyncClient(timeout=timeout, limits=limits) as client:

        async def guarded(req: BenchRequest) -> RequestResult:
            async with limit:
                res = await _one(client, url, model, req, headers)
            bar.update(1)
            return res

        start = time.perf_counter()
        tasks = []
        for req in requests:
            tasks.append(asyncio.create_task(guarded(req)))
            if request_rate != float("inf"):
                await asyncio.sleep(rng.expovariate(request_rate))
        results = await asyncio.gather(*tasks)
        elapsed = time.perf_counter() - start
    bar.close()
    return summarize(results, elapsed, max_concurrency, request_rate)


def summarize(
    results: list[RequestResult], elapsed: float, max_concurrency: int | None, rate: float
) -> dict[str, Any]:
    good = [r for r in results if r.ok]
    num_out = sum(r.output_tokens for r in good)
    num_in = sum(r.prompt_tokens for r in good)
    tpots = [(r.e2e - r.ttft) / (r.output_tokens - 1) for r in good if r.output_tokens > 1]
    ms = 1000.0
    return {
        "num_requests": len(results),
        "completed": len(good),
        "failed": len(results) - len(good),
        "errors": sorted({r.error for r in results if r.error})[:5],
        "max_concurrency": max_concurrency,
        "request_rate": "inf" if rate == float("inf") else rate,
        "elapsed_s": elapsed,
        "requests_per_s": len(good) / elapsed,
        "output_tokens_per_s": num_out / elapsed,
        "total_tokens_per_s": (num_in + num_out) / elapsed,
        "ttft_ms": {k: v * ms for k, v in percentiles([r.ttft for r in good]).items()},
        "tpot_ms": {k: v * ms for k, v in percentiles(tpots).items()},
        "itl_ms": {k: v * ms for k, v in percentiles([x for r in good for x in r.itls]).items()},
        "e2e_ms": {k: v * ms for k, v in percentiles([r.e2e for r in good]).items()},
    }
