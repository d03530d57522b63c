"""AsyncLLM: concurrent streams, cancellation frees blocks, step failures, dead loop."""

from __future__ import annotations

import asyncio
import time
from typing import Any

import pytest
from engine.async_llm import AsyncLLM
from engine.errors import EngineDeadError, EngineRequestError, QueueFullError
from engine.sampling_params import SamplingParams
from fake_runner import build_engine, scripted, seeded_random


@pytest.fixture
def async_llm(byte_tokenizer: Any) -> Any:
    eng = build_engine(
        byte_tokenizer, seeded_random(range(10, 200)), max_num_seqs=4, step_delay_s=0.005
    )
    llm = AsyncLLM(eng)
    yield llm
    llm.shutdown()


async def _collect(llm: AsyncLLM, rid: str, prompt: Any, params: SamplingParams) -> list[Any]:
    return [out async for out in llm.generate(prompt, params, rid)]


async def _wait_for(cond: Any, timeout: float = 5.0) -> None:
    deadline = time.monotonic() + timeout
    while not cond():
        assert time.monotonic() < deadline, "condition not reached"
        await asyncio.sleep(0.005)


def test_concurrent_generate_and_cancel_frees_blocks(async_llm: AsyncLLM) -> None:
    llm = async_llm

    async def main() -> None:
        p = SamplingParams(max_tokens=6, seed=3, ignore_eos=True)
        long = SamplingParams(max_tokens=80, seed=1, ignore_eos=True)
        tasks = [
            asyncio.create_task(_collect(llm, f"r{i}", f"prompt number {i}", p)) for i in range(3)
        ]
        seen = []

        async def cancelled() -> None:
            async for out in llm.generate(list(range(20, 60)), long, "victim"):
                seen.append(out)
                await asyncio.sleep(0.01)  # a slow client

        victim = asyncio.create_task(cancelled())
        await _wait_for(lambda: len(seen) >= 3)
        victim.cancel()
        with pytest.raises(asyncio.CancelledError):
            await victim
        results = await asyncio.gather(*tasks)
        for i, outs in enumerate(results):
            assert outs[-1].finished and not any(o.finished for o in outs[:-1])
            tokens = [t for o in outs for t in o.outputs[0].delta_token_ids]
            assert tokens == outs[-1].outputs[0].token_ids and len(tokens) == 6
            text = "".join(o.outputs[0].delta_text for o in outs)
            assert text == outs[-1].outputs[0].text, i
        assert not seen[-1].finished and len(seen[-1].outputs[0].token_ids) < 80

        def all_free() -> bool:
            s = llm.stats()
            return (
                s.num_running == 0
                and s.num_waiting == 0
                and (s.num_free_blocks == s.num_total_blocks)
            )

        await _wait_for(all_free)
        assert llm.counters().finished_by_reason == {"length": 3, "abort": 1}

    asyncio.run(main())


def test_closing_the_generator_aborts(async_llm: AsyncLLM) -> None:
    llm = async_llm

    async def main() -> None:
        gen = llm.generate("hello", SamplingParams(max_tokens=100, ignore_eos=True), "g")
        first = await gen.__anext__()
        assert not first.finished
        await gen.aclose()  # the client disconnected (GeneratorExit)
        await _wait_for(lambda: llm.counters().finished_by_reason.get("abort") == 1)
        s = llm.stats()
        assert s.num_free_blocks == s.num_total_blocks

    asyncio.run(main())


def test_explicit_abort_ends_the_stream(async_llm: AsyncLLM) -> None:
    llm = async_llm

    async def main() -> None:
        outs = []
        async for out in llm.generate("hi", SamplingParams(max_tokens=120, ignore_eos=True), "x"):
            outs.append(out)
            if len(outs) == 2:
                await llm.abort("x")
        assert outs[-1].finished and outs[-1].outputs[0].finish_reason == "abort"

    asyncio.run(main())


def test_validation_errors_raise_at_once(async_llm: AsyncLLM) -> None:
    llm = async_llm

    async def main() -> None:
        with pytest.raises(ValueError, match="maximum context length"):
            await _collect(llm, "a", [1, 2, 3], SamplingParams(max_tokens=10_000))
        with pytest.raises(ValueError, match="prompt is empty"):
            await _collect(llm, "b", "", SamplingParams())
        # Duplicate id while the first is running: error, and the first is unharmed.
        gen = llm.generate("x", SamplingParams(max_tokens=30, ignore_eos=True), "dup")
        await gen.__anext__()
        with pytest.raises(ValueError, match="already"):
            await _collect(llm, "dup", "y", SamplingParams(max_tokens=2))
        rest = [o async for o in gen]
        assert rest[-1].finished and len(rest[-1].outputs[0].token_ids) == 30

    asyncio.run(main())


def test_queue_full_is_reported(byte_tokenizer: Any) -> None:
    from engine.core.engine_core import EngineCore
    from engine.core.kv_cache import KVCacheConfig
    from engine.core.scheduler import Scheduler
    from engine.core.scheduler_config import SchedulerConfig
    from engine.llm_engine import LLMEngine
    from fake_runner import FakeRunner

    sched = Scheduler(SchedulerConfig(1, 64, 128, max_num_queued_reqs=1), KVCacheConfig(64, 4))
    runner = FakeRunner(seeded_random(range(10, 100)))
    runner.step_delay_s = 0.01
    eng = LLMEngine(EngineCore(sched, runner), byte_tokenizer, max_model_len=128, vocab_size=300)
    llm = AsyncLLM(eng)
    p = SamplingParams(max_tokens=20, ignore_eos=True)

    async def main() -> None:
        running = llm.generate("a", p, "q1")  # runs (max_num_seqs=1)
        await running.__anext__()
        waiting = asyncio.create_task(_collect(llm, "q2", "b", p))  # fills the queue
        await _wait_for(lambda: llm.stats().num_waiting == 1)
        with pytest.raises(QueueFullError, match="max-num-queued-reqs"):
            await _collect(llm, "q3", "c", p)
        assert (await waiting)[-1].finished
        await running.aclose()

    try:
        asyncio.run(main())
    finally:
        llm.shutdown()


def test_step_failure_fails_requests_then_engine_goes_on(byte_tokenizer: Any) -> None:
    eng = build_engine(
        byte_tokenizer, scripted([50] * 50, byte_tokenizer.eos_token_id), step_delay_s=0.01
    )
    llm = AsyncLLM(eng)
    try:

        async def main() -> None:
            gen = llm.generate("hi", SamplingParams(max_tokens=40), "boom")
            await gen.__anext__()
            eng.engine_core.runner.fail_next_step = RuntimeError("kernel exploded")
            with pytest.raises(EngineRequestError, match="kernel exploded"):
                async for _ in gen:
                    pass
            s = llm.stats()
            await _wait_for(lambda: llm.stats().num_free_blocks == s.num_total_blocks)
            outs = await _collect(llm, "after", "hi", SamplingParams(max_tokens=3))
            assert outs[-1].outputs[0].token_ids == [50, 50, 50]
            assert llm.is_ready and llm.dead_error is None

        asyncio.run(main())
    finally:
        llm.shutdown()


def test_dead_loop_fails_pending_and_new_requests(byte_tokenizer: Any) -> None:
    eng = build_engine(
        byte_tokenizer, scripted([50] * 50, byte_tokenizer.eos_token_id), step_delay_s=0.01
    )
    llm = AsyncLLM(eng)

    def broken(*_: Any, **__: Any) -> Any:
        raise RuntimeError("cannot even clean up")

    async def main() -> None:
        gen = llm.generate("hi", SamplingParams(max_tokens=40), "r")
        await gen.__anext__()
        eng.fail_all_requests = broken  # type: ignore[method-assign]
        eng.engine_core.runner.fail_next_step = RuntimeError("kernel exploded")
        with pytest.raises(EngineDeadError, match="cannot even clean up"):
            async for _ in gen:
                pass
        assert llm.dead_error is not None and not llm.is_ready
        with pytest.raises(EngineDeadError):
            await _collect(llm, "new", "hi", SamplingParams())

    asyncio.run(main())
    llm.shutdown()


def test_slow_caller_gets_merged_updates_with_every_delta(async_llm: AsyncLLM) -> None:
    """A caller that blocks its event loop while steps go on receives fewer updates, each
    the newest cumulative output, whose deltas still add up to the whole text and ids."""
    llm = async_llm

    async def main() -> None:
        params = SamplingParams(max_tokens=40, seed=5, ignore_eos=True, logprobs=1)
        outs = []
        async for out in llm.generate(list(range(20, 40)), params, "slow"):
            outs.append(out)
            time.sleep(0.03)  # blocks the loop: ~6 engine steps queue up meanwhile
        final = outs[-1].outputs[0]
        assert outs[-1].finished and len(final.token_ids) == 40
        assert len(outs) < 20, f"{len(outs)} updates: queued ones were not merged"
        assert [t for o in outs for t in o.outputs[0].delta_token_ids] == final.token_ids
        assert "".join(o.outputs[0].delta_text for o in outs) == final.text
        merged_lps = [lp for o in outs for lp in (o.outputs[0].delta_logprobs or [])]
        assert merged_lps == final.logprobs

    asyncio.run(main())
