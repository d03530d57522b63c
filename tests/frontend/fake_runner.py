"""A model runner stand-in for front-end tests: real scheduler and engine core, scripted
tokens instead of a model.

``next_token(request)`` chooses each sampled token from the request's state, so tests can
script the output text (stop strings across tokens) or derive tokens from the seed.
"""

from __future__ import annotations

import random
import time
from collections.abc import Callable, Mapping
from typing import Any

from engine.core.engine_core import EngineCore
from engine.core.kv_cache import KVCacheConfig
from engine.core.request import Request
from engine.core.scheduler import Scheduler
from engine.core.scheduler_config import SchedulerConfig
from engine.core.scheduler_output import ModelRunnerOutput, SchedulerOutput
from engine.llm_engine import LLMEngine


class FakeRunner:
    def __init__(self, next_token: Callable[[Request], int]) -> None:
        self.next_token = next_token
        self.num_steps = 0
        self.fail_next_step: Exception | None = None
        self.step_delay_s = 0.0  # pretend a step takes time (async tests)

    def execute(self, scheduler_output: SchedulerOutput) -> ModelRunnerOutput:
        self.num_steps += 1
        if self.step_delay_s:
            time.sleep(self.step_delay_s)
        if self.fail_next_step is not None:
            exc, self.fail_next_step = self.fail_next_step, None
            raise exc
        out = ModelRunnerOutput()
        for sched in scheduler_output.scheduled:
            if sched.sample:
                out.sampled_token_ids[sched.req_id] = self.next_token(sched.request)
        return out


def scripted(token_ids: list[int], eos: int) -> Callable[[Request], int]:
    """Emit ``token_ids`` in order, then EOS."""

    def pick(request: Request) -> int:
        i = len(request.output_token_ids)
        return token_ids[i] if i < len(token_ids) else eos

    return pick


def seeded_random(vocab: range) -> Callable[[Request], int]:
    """A token drawn from the request's seed and position (random when unseeded)."""
    unseeded = random.Random(1234)

    def pick(request: Request) -> int:
        seed = request.sampling_params.seed
        if seed is None:
            return unseeded.choice(vocab)
        key = (seed, len(request.output_token_ids), tuple(request.prompt_token_ids))
        return random.Random(str(key)).choice(vocab)

    return pick


def build_engine(
    tokenizer: Any,
    next_token: Callable[[Request], int],
    *,
    num_blocks: int = 64,
    block_size: int = 4,
    max_model_len: int = 128,
    max_num_seqs: int = 8,
    max_num_batched_tokens: int = 64,
    enable_prefix_caching: bool = True,
    sampling_defaults: Mapping[str, Any] | None = None,
    step_delay_s: float = 0.0,
) -> LLMEngine:
    scheduler = Scheduler(
        SchedulerConfig(max_num_seqs, max_num_batched_tokens, max_model_len),
        KVCacheConfig(num_blocks, block_size, enable_prefix_caching),
    )
    runner = FakeRunner(next_token)
    runner.step_delay_s = step_delay_s
    core = EngineCore(scheduler, runner)
    return LLMEngine(
        core,
        tokenizer,
        max_model_len=max_model_len,
        vocab_size=len(tokenizer),
        sampling_defaults=sampling_defaults,
        eos_token_ids=[tokenizer.eos_token_id],
    )
