"""One user request's fan-out into core requests (several prompts times ``n``) and the
ids and choice indexes that fan their outputs back in.

::

    request "r", 2 prompts, n = 2
      prompt 0 ── "r-0" ──┬── core request "r-0-0"   choice 0
                          └── core request "r-0-1"   choice 1
      prompt 1 ── "r-1" ──┬── core request "r-1-0"   choice 2
                          └── core request "r-1-1"   choice 3

    one prompt: its id is "r"; n == 1: its core request's id is the prompt's id
    choice index = prompt index * n + sample index

The front end (``InputProcessor.prepare_all``) makes one ``PreparedRequest`` per prompt
with its n core requests, which share the prompt (so the prefix cache computes it once);
a seeded request gives sample i the seed ``seed + i`` so the samples differ yet the whole
request reproduces. The engine runs each prompt as one user request (``ParentRequest``
gathers its n samples into one ``RequestOutput``); ``merge_outputs`` gathers the prompts'
streams, and ``choice_index`` numbers a sample among all of them.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncGenerator, AsyncIterator, Sequence

from engine.outputs import RequestOutput
from engine.sampling_params import SamplingParams


def prompt_request_ids(request_id: str, num_prompts: int) -> list[str]:
    """The ids of a request's prompts: the id itself for a single prompt."""
    if num_prompts == 1:
        return [request_id]
    return [f"{request_id}-{p}" for p in range(num_prompts)]


def child_req_ids(request_id: str, n: int) -> list[str]:
    """Core request ids of one prompt's n samples: the prompt's id itself for n == 1."""
    if n == 1:
        return [request_id]
    return [f"{request_id}-{i}" for i in range(n)]


def child_params(params: SamplingParams, n: int) -> list[SamplingParams]:
    """Per-sample sampling params: n == 1 each, seeds ``seed + i``."""
    if n == 1:
        return [params.clone(n=1)]
    return [
        params.clone(n=1, seed=None if params.seed is None else params.seed + i) for i in range(n)
    ]


def choice_index(prompt_index: int, n: int, sample_index: int = 0) -> int:
    """A sample's index among all the request's choices."""
    return prompt_index * n + sample_index


def split_choice(index: int, n: int) -> tuple[int, int]:
    """(prompt index, sample index) of a choice: the inverse of ``choice_index``."""
    return divmod(index, n)


async def merge_outputs(
    streams: Sequence[AsyncIterator[RequestOutput]],
) -> AsyncGenerator[tuple[int, RequestOutput], None]:
    """The prompts' outputs as they come, each tagged with its prompt's index; each stream
    is read up to its finished output. An error in one stream ends the merge with it."""
    if len(streams) == 1:
        async for out in streams[0]:
            yield 0, out
            if out.finished:
                return
        return
    queue: asyncio.Queue[tuple[int, RequestOutput | BaseException | None]] = asyncio.Queue()

    async def pump(p: int, stream: AsyncIterator[RequestOutput]) -> None:
        try:
            async for out in stream:
                await queue.put((p, out))
                if out.finished:
                    break
        except BaseException as exc:  # forwarded to the consumer
            await queue.put((p, exc))
            return
        await queue.put((p, None))

    tasks = [asyncio.ensure_future(pump(p, s)) for p, s in enumerate(streams)]
    try:
        remaining = len(streams)
        while remaining:
            p, item = await queue.get()
            if item is None:
                remaining -= 1
            elif isinstance(item, BaseException):
                raise item
            else:
                yield p, item
    finally:
        for task in tasks:
            task.cancel()
