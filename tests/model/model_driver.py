"""A hand-written scheduler loop for runner tests (the real scheduler lives elsewhere).

Blocks are handed out from a shuffled free list so block tables are not contiguous; a
request can start from another request's blocks (a cached prefix) and prompts can be
split into chunks of ``chunk_size`` tokens.
"""

from __future__ import annotations

import math
import random
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
from engine.config import EngineArgs
from engine.core.request import ReqId, Request
from engine.core.scheduler_output import ScheduledRequest, SchedulerOutput
from engine.model_executor.runner import ModelRunner
from engine.model_executor.source import open_model_source
from engine.sampling_params import SamplingParams


def make_runner(pm: Any, model_dir: Path, **overrides: Any) -> ModelRunner:
    settings: dict[str, Any] = {
        "model": str(model_dir),
        "device": "cpu",
        "dtype": "float32",
        "block_size": 4,
        "kv_cache_memory_bytes": 4 << 20,
    }
    settings.update(overrides)
    args = EngineArgs(**settings)
    return ModelRunner(args, pm, open_model_source(args, pm))


@dataclass
class DriverRequest:
    request: Request
    block_ids: list[int]
    chunk_size: int | None = None
    outputs: list[int] = field(default_factory=list)


class GreedyDriver:
    def __init__(self, runner: ModelRunner, seed: int = 0) -> None:
        self.runner = runner
        self.free = list(range(runner.num_blocks))
        random.Random(seed).shuffle(self.free)
        self.steps = 0

    def new_request(
        self,
        req_id: str,
        prompt: list[int],
        max_tokens: int,
        chunk_size: int | None = None,
        prefix_from: DriverRequest | None = None,
        num_prefix_blocks: int = 0,
        **params: Any,
    ) -> DriverRequest:
        sp = SamplingParams(temperature=0.0, max_tokens=max_tokens, **params)
        req = Request(ReqId(req_id), list(prompt), sp)
        bs = self.runner.block_size
        total_blocks = math.ceil((len(prompt) + max_tokens) / bs)
        blocks: list[int] = []
        if prefix_from is not None:
            blocks = prefix_from.block_ids[:num_prefix_blocks]
            req.num_computed_tokens = num_prefix_blocks * bs
            req.num_cached_tokens = num_prefix_blocks * bs
        blocks = blocks + [self.free.pop() for _ in range(total_blocks - len(blocks))]
        return DriverRequest(req, blocks, chunk_size)

    def _schedule(self, dr: DriverRequest) -> ScheduledRequest:
        req = dr.request
        done = req.num_computed_tokens
        if done < req.num_prompt_tokens:
            n = req.num_prompt_tokens - done
            if dr.chunk_size is not None:
                n = min(n, dr.chunk_size)
            tokens = req.prompt_token_ids[done : done + n]
            sample = done + n == req.num_prompt_tokens
        else:
            tokens, sample = [req.all_token_ids[done]], True
        return ScheduledRequest(req.req_id, tokens, done, dr.block_ids, sample, req)

    def step(self, active: list[DriverRequest]) -> dict[ReqId, Any]:
        scheduled = [self._schedule(dr) for dr in active]
        so = SchedulerOutput(scheduled, sum(s.num_tokens for s in scheduled))
        out = self.runner.execute(so)
        self.steps += 1
        for dr, sr in zip(active, scheduled, strict=True):
            dr.request.num_computed_tokens += sr.num_tokens
            if sr.sample:
                token = out.sampled_token_ids[sr.req_id]
                dr.request.output_token_ids.append(token)
                dr.outputs.append(token)
        return {"output": out}

    def run(self, requests: list[DriverRequest]) -> list[list[int]]:
        """Step all requests together until each has ``max_tokens`` outputs."""
        while True:
            active = [
                dr
                for dr in requests
                if len(dr.outputs) < (dr.request.sampling_params.max_tokens or 0)
            ]
            if not active:
                return [dr.outputs for dr in requests]
            self.step(active)


def hf_model(model_dir: Path) -> Any:
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(str(model_dir), dtype=torch.float32)
    model.generation_config.eos_token_id = None  # generate exactly max_new_tokens
    return model.eval()


def hf_greedy(model: Any, prompt: list[int], max_new_tokens: int) -> list[int]:
    with torch.no_grad():
        ids = torch.tensor([prompt])
        out = model.generate(
            ids,
            attention_mask=torch.ones_like(ids),
            max_new_tokens=max_new_tokens,
            do_sample=False,
            pad_token_id=0,
        )
    return out[0, len(prompt) :].tolist()
