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
from dataclasses import dataclass, field, replace
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
            buffer = b""
            async for data in resp.aiter_raw():
                now = time.perf_counter()
                buffer += data
                *events, buffer = buffer.split(b"\n\n")
                for event in events:
                    kind = _classify(event)
                    if kind == "content":
                        if result.ttft == 0.0:
                            result.ttft = now - start
                        else:
                            result.itls.append(now - last)
                        last = now
                    elif kind == "usage":
                        chunk = json.loads(event[6:])
                        result.output_tokens = chunk["usage"]["completion_tokens"]
                    elif kind == "error":
                        result.error = event[6:206].decode(errors="replace")
                        return result
        result.e2e = time.perf_counter() - start
        result.ok = result.output_tokens == req.output_len
        if not result.ok:
            result.error = f"expected {req.output_len} tokens, got {result.output_tokens}"
    except Exception as exc:  # a benchmark reports failures, it does not stop on them
        result.error = f"{type(exc).__name__}: {exc}"
    return result


def _classify(event: bytes) -> str:
    """What one SSE event is, without parsing the JSON of the (many) content chunks: the
    client must stay cheaper than the server it measures. Keys are JSON-quoted, so text
    that happens to contain ``"error":`` is escaped and cannot match."""
    if not event.startswith(b"data: ") or event == b"data: [DONE]":
        return "other"
    if b'"error":' in event:
        return "error"
    if b'"choices":[]' in event:
        return "usage"
    return "content" if b'"choices":[' in event else "other"


@dataclass(frozen=True)
class LoadSpec:
    """What one client (process) sends: its requests, how many at a time, at what rate."""

    base_url: str
    model: str
    requests: list[BenchRequest]
    max_concurrency: int | None
    request_rate: float
    api_key: str | None = None
    seed: int = 0


async def run_serving(
    base_url: str,
    model: str,
    requests: list[BenchRequest],
    max_concurrency: int | None,
    request_rate: float,
    api_key: str | None = None,
    seed: int = 0,
    num_workers: int = 1,
) -> dict[str, Any]:
    """Send ``requests`` (``max_concurrency`` at a time, at ``request_rate``) and summarize.

    ``num_workers`` > 1 splits the requests, the concurrency and the rate over that many
    client processes, so a fast server is not measured through one Python client's limit.
    """
    spec = LoadSpec(base_url, model, requests, max_concurrency, request_rate, api_key, seed)
    if num_workers > 1:
        return await asyncio.to_thread(_run_workers, spec, num_workers)
    from tqdm import tqdm

    bar = tqdm(total=len(requests), desc="requests")
    t0 = time.monotonic()
    results = await _run_shard(spec, bar.update)
    elapsed = time.monotonic() - t0
    bar.close()
    return summarize(results, elapsed, max_concurrency, request_rate)


async def _run_shard(spec: LoadSpec, on_done: Any) -> list[RequestResult]:
    import httpx

    url = spec.base_url.rstrip("/") + "/completions"
    headers = {"Authorization": f"Bearer {spec.api_key}"} if spec.api_key else {}
    width = spec.max_concurrency or len(spec.requests) or 1
    limit = asyncio.Semaphore(width)
    rng = random.Random(spec.seed)
    timeout = httpx.Timeout(None, connect=30.0)
    limits = httpx.Limits(max_connections=width)

    async with httpx.AsyncClient(timeout=timeout, limits=limits) as client:

        async def guarded(req: BenchRequest) -> RequestResult:
            async with limit:
                res = await _one(client, url, spec.model, req, headers)
            on_done(1)
            return res

        tasks = []
        for req in spec.requests:
            tasks.append(asyncio.create_task(guarded(req)))
            if spec.request_rate != float("inf"):
                await asyncio.sleep(rng.expovariate(spec.request_rate))
        return list(await asyncio.gather(*tasks))


def _worker(spec: LoadSpec, start_at: float) -> tuple[float, float, list[RequestResult]]:
    """One client process: its shard of the requests, started at the shared instant."""
    while time.monotonic() < start_at:
        time.sleep(0.001)

    def done(n: int) -> None:
        with _COUNTER.get_lock():
            _COUNTER.value += n

    t0 = time.monotonic()
    results = asyncio.run(_run_shard(spec, done))
    return t0, time.monotonic(), results


def _run_workers(spec: LoadSpec, num_workers: int) -> dict[str, Any]:
    import concurrent.futures
    import multiprocessing

    from tqdm import tqdm

    num_workers = max(1, min(num_workers, len(spec.requests)))
    ctx = multiprocessing.get_context("spawn")
    counter = ctx.Value("i", 0)
    start_at = time.monotonic() + 3.0  # time for the spawned workers to import
    conc = spec.max_concurrency
    shards = [
        replace(
            spec,
            requests=spec.requests[w::num_workers],
            max_concurrency=None if conc is None else max(
                1, conc // num_workers + (w < conc % num_workers)
            ),
            request_rate=spec.request_rate / num_workers,
            seed=spec.seed + w,
        )
        for w in range(num_workers)
    ]  # fmt: skip
    bar = tqdm(total=len(spec.requests), desc="requests")
    with concurrent.futures.ProcessPoolExecutor(
        num_workers, mp_context=ctx, initializer=_init_worker, initargs=(counter,)
    ) as pool:
        futures = [pool.submit(_worker, shard, start_at) for shard in shards]
        while not all(f.done() for f in futures):
            bar.n = counter.value
            bar.refresh()
            time.sleep(0.2)
        outs = [f.result() for f in futures]
    bar.n = counter.value
    bar.close()
    results = [r for _, _, rs in outs for r in rs]
    elapsed = max(end for _, end, _ in outs) - min(begin for begin, _, _ in outs)
    summary = summarize(results, elapsed, spec.max_concurrency, spec.request_rate)
    summary["num_client_workers"] = num_workers
    return summary


_COUNTER: Any = None  # in a worker process: the shared count of finished requests


def _init_worker(counter: Any) -> None:
    global _COUNTER
    _COUNTER = counter


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
