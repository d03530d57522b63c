"""A user request and its n sequences: fan-out into core requests, fan-in of outputs.

``n > 1`` becomes n core requests that share the prompt (so the prefix cache computes it
once) with ids ``f"{request_id}-{i}"``; a seeded request gives child i the seed
``seed + i`` so the samples differ yet the whole request reproduces.
"""

from __future__ import annotations

from engine.outputs import RequestOutput
from engine.outputs_processing.request_state import RequestState
from engine.sampling_params import SamplingParams


def child_req_ids(request_id: str, n: int) -> list[str]:
    """Core request ids of a user request: the id itself for n == 1."""
    if n == 1:
        return [request_id]
    return [f"{request_id}-{i}" for i in range(n)]


def child_params(params: SamplingParams, n: int) -> list[SamplingParams]:
    """Per-sequence sampling params: n == 1 each, seeds ``seed + i``."""
    if n == 1:
        return [params.clone(n=1)]
    return [
        params.clone(n=1, seed=None if params.seed is None else params.seed + i) for i in range(n)
    ]


class ParentRequest:
    """Aggregates the sequences of one user request into one ``RequestOutput``."""

    def __init__(
        self,
        request_id: str,
        prompt: str | None,
        prompt_token_ids: list[int],
        children: list[RequestState],
    ) -> None:
        self.request_id = request_id
        self.prompt = prompt
        self.prompt_token_ids = prompt_token_ids
        self.children = children

    @property
    def finished(self) -> bool:
        return all(c.finished for c in self.children)

    @property
    def has_update(self) -> bool:
        return any(c.has_update for c in self.children)

    def take_output(self) -> RequestOutput:
        """All n completions (cumulative) with each one's delta since the last output."""
        first = self.children[0]
        errors = [c.error for c in self.children if c.error]
        return RequestOutput(
            request_id=self.request_id,
            prompt=self.prompt,
            prompt_token_ids=self.prompt_token_ids,
            outputs=[c.take_output() for c in self.children],
            finished=self.finished,
            prompt_logprobs=(
                list(first.prompt_logprobs) if first.prompt_logprobs is not None else None
            ),
            num_cached_tokens=first.num_cached_tokens,
            error=errors[0] if errors else None,
        )
