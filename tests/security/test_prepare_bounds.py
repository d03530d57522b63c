"""The prepare pool cannot pile up (issue 17 item 2): a job still queued at its deadline is
dropped, not run later, and a full queue answers 503 at once."""

from __future__ import annotations

import asyncio
import threading
import time
from typing import Any

import pytest
from engine.entrypoints.openai.errors import APIError
from engine.entrypoints.openai.serving_base import ServingContext


def _ctx(**kwargs: Any) -> ServingContext:
    return ServingContext(engine=None, served_model_names=["m"], metrics=None, **kwargs)  # type: ignore[arg-type]


def test_a_queued_job_past_its_deadline_never_runs() -> None:
    ctx = _ctx(max_prepare_workers=1, prepare_timeout_s=0.2)
    release = threading.Event()
    ran: list[str] = []

    def work(name: str) -> str:
        ran.append(name)
        if name == "slow":
            release.wait(5)
        return name

    async def main() -> None:
        slow = asyncio.ensure_future(ctx.run_prepare(work, "slow"))
        await asyncio.sleep(0.05)
        with pytest.raises(APIError, match="exceeded 0.2 s"):
            await ctx.run_prepare(work, "queued")
        release.set()
        with pytest.raises(APIError):
            await slow  # it ran past the deadline too
        await asyncio.sleep(0.2)
        assert ran == ["slow"], ran
        assert ctx._num_prepare_pending == 0
        assert await ctx.run_prepare(work, "later") == "later"

    asyncio.run(main())


def test_a_full_prepare_queue_is_refused_at_once() -> None:
    ctx = _ctx(max_prepare_workers=1, max_prepare_queue=1, prepare_timeout_s=5)
    release = threading.Event()

    async def main() -> None:
        first = asyncio.ensure_future(ctx.run_prepare(release.wait, 5))
        second = asyncio.ensure_future(ctx.run_prepare(release.wait, 5))
        await asyncio.sleep(0.05)
        start = time.monotonic()
        with pytest.raises(APIError) as info:
            await ctx.run_prepare(release.wait, 5)
        assert info.value.status == 503 and info.value.code == "queue_full"
        assert time.monotonic() - start < 0.5
        release.set()
        assert await first and await second

    asyncio.run(main())
