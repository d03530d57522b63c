"""Soak test of a running server: many requests with random disconnects, cancellations and
bursts past the queue bound; every request must end in a complete response or a documented
error within a deadline, and the server must go back to idle with every KV block free.

Request kinds (chosen at random): a completion or chat request read whole; a stream read to
``[DONE]``; a stream the client drops after a few chunks; a request the client cancels after
a random delay; a hostile request that must be refused with a 400 (a lone surrogate, a
deeply nested or oversized schema, a runaway regex, a coerced integer, prompt text no
context could hold: issue 17); and, now and then, a burst of simultaneous requests past the
waiting-queue bound, of which some must get 503 + ``Retry-After``.

Outcomes: ``ok`` (200 with finish_reason on every choice, or a stream ending in
``[DONE]``), ``refused`` (503 queue_full / shutting down, with Retry-After), ``rejected`` (the
400 a hostile request must get), ``cancelled`` (the client's own doing), and failures:
``hung`` (no answer within the deadline), ``server_error`` (any other 5xx), ``bad``
(anything else). The run fails on any failure, or if the server does not return to zero
running / zero waiting / 0 KV usage / all blocks free.

    python benchmarks/soak.py --base-url http://127.0.0.1:8000 --api-key KEY \\
        --duration 600 --json-out benchmarks/results/soak.json
    python benchmarks/soak.py --model DIR --duration 600   # starts engine serve itself
"""

from __future__ import annotations

import argparse
import asyncio
import json
import random
import subprocess
import sys
import time
from collections import Counter
from dataclasses import dataclass, field
from typing import Any

import httpx

KINDS = ("complete", "chat", "stream", "stream_drop", "cancel", "hostile", "burst")
KIND_WEIGHTS = (3, 3, 3, 2, 2, 1, 1)
FAILURES = ("hung", "server_error", "bad")


def _nested_schema(depth: int) -> dict[str, Any]:
    schema: dict[str, Any] = {"type": "string"}
    for _ in range(depth):
        schema = {"type": "object", "properties": {"a": schema}, "required": ["a"]}
    return schema


def hostile_bodies(model: str) -> list[tuple[str, bytes]]:
    """(path, raw JSON body) pairs the server must refuse with a 400 (issue 17)."""
    base = {"model": model, "max_tokens": 2, "prompt": "hi"}
    changes: list[dict[str, Any]] = [
        {"structured_outputs": {"regex": "a{1000}{1000}"}},
        {"structured_outputs": {"json": _nested_schema(100)}},
        {"structured_outputs": {"json": {"type": "string", "minLength": 100000}}},
        {"max_tokens": "4"},
        {"prompt": [1, True]},
        {"stream_options": {"include_usage": True}},
        {"prompt": "ab " * 40000},
    ]
    bodies = [("/v1/completions", json.dumps({**base, **c}).encode()) for c in changes]
    name = model.encode()
    chat = b'{"model": "%s", "messages": [{"role": "user", "content": "a\\ud800b"}]}'
    bodies.append(("/v1/chat/completions", chat % name))
    bodies.append(("/tokenize", b'{"model": "%s", "prompt": "a\\udc00"}' % name))
    return bodies


@dataclass
class SoakConfig:
    base_url: str
    api_key: str | None = None
    num_requests: int = 2000  # stop after this many (0: no count bound)
    duration_s: float = 120.0  # ... or after this long
    concurrency: int = 24
    burst_size: int = 40
    max_tokens: int = 8
    request_timeout_s: float = 60.0
    seed: int = 0
    model: str = "tiny"


@dataclass
class SoakResult:
    outcomes: Counter[str] = field(default_factory=Counter)
    by_kind: dict[str, Counter[str]] = field(default_factory=dict)
    failures: list[str] = field(default_factory=list)
    latencies_s: list[float] = field(default_factory=list)
    num_requests: int = 0
    wall_s: float = 0.0
    idle_state: dict[str, Any] | None = None
    start_state: dict[str, Any] | None = None

    def record(self, kind: str, outcome: str, detail: str, latency_s: float) -> None:
        self.num_requests += 1
        self.outcomes[outcome] += 1
        self.by_kind.setdefault(kind, Counter())[outcome] += 1
        if outcome in FAILURES and len(self.failures) < 50:
            self.failures.append(f"{kind}: {outcome}: {detail[:300]}")
        if outcome == "ok":
            self.latencies_s.append(latency_s)

    @property
    def passed(self) -> bool:
        idle = self.idle_state or {}
        back_to_start = (
            idle.get("num_requests_running") == 0
            and idle.get("num_requests_waiting") == 0
            and idle.get("kv_cache_usage") == 0
            and idle.get("num_free_blocks") == idle.get("num_total_blocks")
        )
        return back_to_start and not any(self.outcomes[f] for f in FAILURES)

    def summary(self) -> dict[str, Any]:
        lat = sorted(self.latencies_s)

        def pct(p: float) -> float | None:
            return round(lat[min(len(lat) - 1, int(p * len(lat)))], 4) if lat else None

        return {
            "passed": self.passed,
            "num_requests": self.num_requests,
            "wall_s": round(self.wall_s, 1),
            "requests_per_s": round(self.num_requests / self.wall_s, 2) if self.wall_s else None,
            "outcomes": dict(self.outcomes),
            "by_kind": {k: dict(v) for k, v in sorted(self.by_kind.items())},
            "ok_latency_s": {"p50": pct(0.5), "p90": pct(0.9), "p99": pct(0.99)},
            "failures": self.failures,
            "start_state": self.start_state,
            "idle_state": self.idle_state,
        }


class Soak:
    def __init__(self, config: SoakConfig) -> None:
        self.config = config
        self.rng = random.Random(config.seed)
        self.result = SoakResult()
        headers = {"Authorization": f"Bearer {config.api_key}"} if config.api_key else {}
        self.client = httpx.AsyncClient(
            base_url=config.base_url, headers=headers, timeout=config.request_timeout_s,
            limits=httpx.Limits(max_connections=config.concurrency + config.burst_size + 8),
        )  # fmt: skip
        self._issued = 0
        self._deadline = 0.0

    # -- one request --------------------------------------------------------------------------

    def _body(self, chat: bool, stream: bool) -> tuple[str, dict[str, Any]]:
        cfg = self.config
        common: dict[str, Any] = {
            "model": cfg.model,
            "max_tokens": self.rng.randint(1, cfg.max_tokens),
            "stream": stream,
            "temperature": self.rng.choice([0.0, 0.7, 1.0]),
        }
        if self.rng.random() < 0.3:
            common["n"] = 2
        if self.rng.random() < 0.3:
            common["ignore_eos"] = True
        words = " ".join(self.rng.choice(["alpha", "beta", "gamma", "delta"]) for _ in range(8))
        if chat:
            return "/v1/chat/completions", {
                **common, "messages": [{"role": "user", "content": words}]
            }  # fmt: skip
        return "/v1/completions", {**common, "prompt": words}

    async def one(self, kind: str) -> None:
        start = time.monotonic()
        try:
            outcome, detail = await asyncio.wait_for(
                self._one(kind), self.config.request_timeout_s + 5
            )
        except TimeoutError:
            outcome, detail = "hung", f"no answer within {self.config.request_timeout_s}s"
        except httpx.TimeoutException as exc:
            outcome, detail = "hung", repr(exc)
        except httpx.HTTPError as exc:
            outcome, detail = "bad", f"transport error {exc!r}"
        self.result.record(kind, outcome, detail, time.monotonic() - start)

    async def _hostile(self) -> tuple[str, str]:
        path, body = self.rng.choice(hostile_bodies(self.config.model))
        r = await self.client.post(path, content=body, headers={"Content-Type": "application/json"})
        if r.status_code == 400 and r.json().get("error"):
            return "rejected", ""
        if r.status_code in (429, 503) and r.headers.get("retry-after"):
            return "refused", ""  # the queue was full: admission comes before compiling
        if r.status_code >= 500:
            return "server_error", f"{r.status_code} {r.text[:200]} for {body[:100]!r}"
        return "bad", f"{r.status_code} {r.text[:200]} for {body[:100]!r}"

    async def _one(self, kind: str) -> tuple[str, str]:
        if kind == "hostile":
            return await self._hostile()
        chat = kind == "chat" or (kind != "complete" and self.rng.random() < 0.5)
        stream = kind in ("stream", "stream_drop") or (kind == "cancel" and self.rng.random() < 0.5)
        path, body = self._body(chat, stream)
        if kind == "cancel":
            body["max_tokens"] = self.config.max_tokens * 4
            body["ignore_eos"] = True
            task = asyncio.ensure_future(self._send(path, body, stream, drop_after=None))
            await asyncio.sleep(self.rng.uniform(0.0, 0.3))
            if not task.done():
                task.cancel()
                try:
                    await task
                except asyncio.CancelledError:
                    return "cancelled", ""
            return task.result()
        drop_after = self.rng.randint(1, 3) if kind == "stream_drop" else None
        return await self._send(path, body, stream, drop_after)

    async def _send(
        self, path: str, body: dict[str, Any], stream: bool, drop_after: int | None
    ) -> tuple[str, str]:
        if not stream:
            r = await self.client.post(path, json=body)
            return self._classify(r.status_code, r.headers, r.text, body)
        async with self.client.stream("POST", path, json=body) as r:
            if r.status_code != 200:
                text = (await r.aread()).decode(errors="replace")
                return self._classify(r.status_code, r.headers, text, body)
            num_events = 0
            async for line in r.aiter_lines():
                if not line.startswith("data: "):
                    continue
                num_events += 1
                payload = line[len("data: ") :]
                if payload == "[DONE]":
                    return "ok", ""
                if '"error"' in payload and json.loads(payload).get("error"):
                    return "server_error", payload
                if drop_after is not None and num_events >= drop_after:
                    return "cancelled", "dropped mid-stream"
            return "bad", f"stream ended without [DONE] after {num_events} events"

    def _classify(
        self, status: int, headers: Any, text: str, body: dict[str, Any]
    ) -> tuple[str, str]:
        if status == 200:
            choices = json.loads(text).get("choices", [])
            expected = body.get("n", 1)
            if len(choices) == expected and all(c.get("finish_reason") for c in choices):
                return "ok", ""
            return "bad", f"incomplete body: {text[:200]}"
        if status in (429, 503) and headers.get("retry-after"):
            return "refused", ""
        if status >= 500:
            return "server_error", f"{status} {text[:200]}"
        return "bad", f"{status} {text[:200]}"

    # -- the run ------------------------------------------------------------------------------

    def _more(self) -> bool:
        cfg = self.config
        if cfg.num_requests and self._issued >= cfg.num_requests:
            return False
        return time.monotonic() < self._deadline

    async def _worker(self) -> None:
        while self._more():
            kind = self.rng.choices(KINDS, KIND_WEIGHTS)[0]
            if kind == "burst":
                n = self.config.burst_size
                self._issued += n
                kinds = [self.rng.choice(("complete", "chat", "stream")) for _ in range(n)]
                await asyncio.gather(*(self.one(k) for k in kinds))
            else:
                self._issued += 1
                await self.one(kind)

    async def run(self) -> SoakResult:
        self.result.start_state = await self.load()
        start = time.monotonic()
        self._deadline = start + self.config.duration_s
        try:
            await asyncio.gather(*(self._worker() for _ in range(self.config.concurrency)))
            self.result.wall_s = time.monotonic() - start
            self.result.idle_state = await self.wait_idle()
        finally:
            await self.client.aclose()
        return self.result

    async def load(self) -> dict[str, Any]:
        r = await self.client.get("/load")
        r.raise_for_status()
        return dict(r.json())

    async def wait_idle(self, timeout_s: float = 30.0) -> dict[str, Any]:
        deadline = time.monotonic() + timeout_s
        state = await self.load()
        while time.monotonic() < deadline:
            state = await self.load()
            busy = state["num_requests_running"] or state["num_requests_waiting"]
            if (
                not busy
                and state["kv_cache_usage"] == 0
                and not state.get("num_http_requests_in_flight")
            ):
                break
            await asyncio.sleep(0.2)
        return state


def run_soak(config: SoakConfig) -> SoakResult:
    return asyncio.run(Soak(config).run())


def _start_server(model: str, port: int, extra: list[str]) -> subprocess.Popen[bytes]:
    cmd = [
        sys.executable, "-m", "engine.cli.main", "serve", model, "--port", str(port),
        "--device", "cpu", "--dtype", "float32", "--max-model-len", "128",
        "--kv-cache-memory-bytes", str(2 * 1024 * 1024), "--max-num-seqs", "16",
        "--max-num-queued-reqs", "24", "--served-model-name", "tiny",
        "--log-stats-interval", "30", *extra,
    ]  # fmt: skip
    proc = subprocess.Popen(cmd)
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        try:
            if httpx.get(f"http://127.0.0.1:{port}/health", timeout=1).status_code == 200:
                return proc
        except httpx.HTTPError:
            pass
        time.sleep(0.5)
    proc.kill()
    raise RuntimeError("engine serve did not become healthy")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--base-url", help="a running server (else --model starts one)")
    parser.add_argument("--model", help="model folder for a server started here")
    parser.add_argument("--port", type=int, default=8765)
    parser.add_argument("--api-key")
    parser.add_argument("--num-requests", type=int, default=0, help="0: run for --duration")
    parser.add_argument("--duration", type=float, default=600.0)
    parser.add_argument("--concurrency", type=int, default=24)
    parser.add_argument("--burst-size", type=int, default=40)
    parser.add_argument("--max-tokens", type=int, default=8)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--json-out")
    args = parser.parse_args()
    proc = None
    if args.base_url is None:
        if args.model is None:
            parser.error("give --base-url of a running server or --model to start one")
        proc = _start_server(args.model, args.port, [])
        args.base_url = f"http://127.0.0.1:{args.port}"
    config = SoakConfig(
        base_url=args.base_url, api_key=args.api_key, num_requests=args.num_requests,
        duration_s=args.duration, concurrency=args.concurrency, burst_size=args.burst_size,
        max_tokens=args.max_tokens, seed=args.seed,
    )  # fmt: skip
    try:
        result = run_soak(config)
    finally:
        exit_code = None
        if proc is not None:
            proc.terminate()
            exit_code = proc.wait(60)
    summary = {"command": " ".join(sys.argv), "config": vars(config), **result.summary()}
    if proc is not None:
        summary["server_exit_code"] = exit_code
    text = json.dumps(summary, indent=2, default=str)
    print(text)
    if args.json_out:
        with open(args.json_out, "w") as f:
            f.write(text + "\n")
    return 0 if result.passed else 1


if __name__ == "__main__":
    sys.exit(main())
