"""``AsyncLLM`` under cancellation races: a caller cancelled while its add waits in the
inbox (the engine thread busy in a step) must not kill the engine loop nor leave a request
behind; the watchdog's ``declare_dead`` fails both running requests and queued adds."""

from __future__ import annotations

import asyncio
import threading
import time
from pathlib import Path
from typing import Any

import pytest
from engine.sampling_params import SamplingParams
from inproc import make_engine

pytestmark = pytest.mark.timeout(120)


async def collect(engine: Any, prompt: str, request_id: str, max_tokens: int = 3) -> list[Any]:
    params = SamplingParams(max_tokens=max_tokens, ignore_eos=True, temperature=0.0)
    return [out async for out in engine.generate(prompt, params, request_id)]


def wedge(engine: Any) -> tuple[threading.Event, threading.Event]:
    entered, release = threading.Event(), threading.Event()
    real = engine.engine.step

    def step() -> Any:
        entered.set()
        release.wait(30)
        return real()

    engine.engine.step = step
    return entered, release


def test_cancel_while_add_is_queued_keeps_the_engine_alive(tiny_model: Path) -> None:
    engine = make_engine(tiny_model)
    try:

        async def scenario() -> None:
            entered, release = wedge(engine)
            running = asyncio.ensure_future(collect(engine, "hello", "a", max_tokens=4))
            while not entered.is_set():
                await asyncio.sleep(0.01)
            late = asyncio.ensure_future(collect(engine, "late", "b"))
            await asyncio.sleep(0.1)  # b's add now waits in the inbox
            late.cancel()
            with pytest.raises(asyncio.CancelledError):
                await late
            release.set()
            outs = await running
            assert outs[-1].finished
            assert engine.is_ready and engine.dead_error is None
            again = await collect(engine, "again", "c")
            assert again[-1].finished

        asyncio.run(scenario())
        deadline = time.monotonic() + 5  # stats are a snapshot taken after each step
        while engine.stats().num_running and time.monotonic() < deadline:
            time.sleep(0.01)
        assert engine.engine.get_num_unfinished_requests() == 0
        stats = engine.stats()
        assert stats.num_running == stats.num_waiting == 0 and stats.kv_cache_usage == 0
        assert stats.num_free_blocks == stats.num_total_blocks
    finally:
        engine.shutdown()


def test_declare_dead_fails_running_and_queued(tiny_model: Path) -> None:
    engine = make_engine(tiny_model)
    try:

        async def scenario() -> None:
            entered, release = wedge(engine)
            running = asyncio.ensure_future(collect(engine, "hello", "a", max_tokens=4))
            while not entered.is_set():
                await asyncio.sleep(0.01)
            queued = asyncio.ensure_future(collect(engine, "queued", "b"))
            await asyncio.sleep(0.1)
            assert engine.stalled_for() > 0.05
            engine.declare_dead("watchdog test")
            for task in (running, queued):
                with pytest.raises(Exception, match="watchdog test"):
                    await asyncio.wait_for(task, 5)
            release.set()

        asyncio.run(scenario())
        assert engine.dead_error is not None
    finally:
        engine.shutdown()
