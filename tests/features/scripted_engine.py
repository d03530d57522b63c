"""A stand-in engine that "generates" a fixed script, for checking response shapes.

The tiny random model writes gibberish, so reasoning splits and parsed tool calls are
checked over the real HTTP layer with this engine: it streams ``script`` in ``chunks``
(cumulative ``CompletionOutput`` text, as the real engine does) and records the prompt
text and sampling parameters of the last request.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from typing import Any

from engine.core.outputs import SchedulerStats
from engine.outputs import CompletionOutput, RequestOutput
from engine.sampling_params import SamplingParams
from engine.tokenization import apply_chat_template


class ScriptedAsyncLLM:
    def __init__(self, tokenizer: Any, script: str = "", chunk_size: int = 3) -> None:
        self.tokenizer = tokenizer
        self.script = script
        self.chunk_size = chunk_size
        self.finish_reason = "stop"
        self.max_model_len = 512
        self.is_ready = True
        self.dead_error: BaseException | None = None
        self.last_params: SamplingParams | None = None
        self.last_prompt: str | None = None

    def default_sampling_params(self) -> SamplingParams:
        return SamplingParams(temperature=0.0, eos_token_ids=[])

    def apply_chat_template(
        self,
        messages: list[dict[str, Any]],
        tools: Any = None,
        add_generation_prompt: bool = True,
        chat_template: str | None = None,
        chat_template_kwargs: dict[str, Any] | None = None,
    ) -> str:
        return apply_chat_template(  # the engine's own rendering (and its checks)
            self.tokenizer, messages, tools, add_generation_prompt, chat_template,
            chat_template_kwargs,
        )  # fmt: skip

    def stats(self) -> SchedulerStats:
        return SchedulerStats(
            num_running=0, num_waiting=0, kv_cache_usage=0.0, num_preemptions=0,
            prefix_cache_queries=0, prefix_cache_hits=0, num_free_blocks=1, num_total_blocks=1,
        )  # fmt: skip

    async def abort(self, request_id: str) -> None:
        return None

    def shutdown(self) -> None:
        self.is_ready = False

    async def generate(
        self,
        prompt: Any,
        params: SamplingParams,
        request_id: str,
        priority: int = 0,
        cache_salt: str | None = None,
    ) -> AsyncIterator[RequestOutput]:
        ids = list(prompt) if isinstance(prompt, list) else self.tokenizer.encode(str(prompt))
        self.last_params = params
        self.last_prompt = self.tokenizer.decode(ids)
        pieces = [
            self.script[i : i + self.chunk_size]
            for i in range(0, len(self.script), self.chunk_size)
        ] or [""]
        text = ""
        for i, piece in enumerate(pieces):
            await asyncio.sleep(0)
            text += piece
            last = i == len(pieces) - 1
            outputs = [
                CompletionOutput(
                    index=j,
                    text=text,
                    token_ids=list(range(i + 1)),
                    finish_reason=self.finish_reason if last else None,
                )
                for j in range(params.n)
            ]
            yield RequestOutput(request_id, None, ids, outputs, last)
