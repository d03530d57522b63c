"""AsyncLLM over a real tiny model: concurrent streams match offline greedy results, and a
request cancelled mid-way frees its KV blocks."""

from __future__ import annotations

import asyncio
import time
from pathlib import Path
from typing import Any

import pytest
from engine import LLM, SamplingParams
from engine.async_llm import AsyncLLM
from engine.config import EngineArgs
from engine_sdk.testing.models import build_tiny_model

ARGS = {"device": "cpu", "dtype": "float32", "block_size": 4, "kv_cache_memory_bytes": 1 << 20}
PROMPTS = ["Hello world! How are you today?", "The quick brown fox", "A", "Numbers: 1 2 3"]


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return build_tiny_model(tmp_path_factory.mktemp("qwen3"), "Qwen3ForCausalLM")


def test_concurrent_streams_and_cancellation(model_dir: Path) -> None:
    greedy = SamplingParams(temperature=0.0, max_tokens=10, ignore_eos=True)
    offline = LLM(str(model_dir), **ARGS).generate(PROMPTS, greedy, use_tqdm=False)
    llm = AsyncLLM.from_args(EngineArgs.from_kwargs(model=str(model_dir), **ARGS))
    assert llm.is_ready and llm.max_model_len > 0

    async def stream(i: int) -> list[Any]:
        return [o async for o in llm.generate(PROMPTS[i], greedy, f"r{i}")]

    async def main() -> None:
        tasks = [asyncio.create_task(stream(i)) for i in range(len(PROMPTS))]
        seen: list[Any] = []

        async def victim() -> None:
            long = SamplingParams(temperature=0.0, max_tokens=200, ignore_eos=True)
            async for out in llm.generate("a long running request", long, "victim"):
                seen.append(out)

        v = asyncio.create_task(victim())
        results = await asyncio.gather(*tasks)
        deadline = time.monotonic() + 30
        while len(seen) < 3:
            assert time.monotonic() < deadline
            await asyncio.sleep(0.01)
        v.cancel()
        with pytest.raises(asyncio.CancelledError):
            await v
        for outs, ref in zip(results, offline, strict=True):
            final = outs[-1]
            assert final.finished and final.outputs[0].token_ids == ref.outputs[0].token_ids
            assert "".join(o.outputs[0].delta_text for o in outs) == ref.outputs[0].text
        assert not seen[-1].finished
        while True:  # the abort reaches the engine thread between steps
            s = llm.stats()
            if s.num_running == 0 and s.num_free_blocks == s.num_total_blocks:
                break
            assert time.monotonic() < deadline, s
            await asyncio.sleep(0.01)
        assert llm.counters().finished_by_reason == {"length": len(PROMPTS), "abort": 1}

    try:
        asyncio.run(main())
    finally:
        llm.shutdown()
    assert not llm.is_ready
