"""A user request's n samples: the fan-in of their outputs into one ``RequestOutput``.

The fan-out (n core requests ``f"{request_id}-{i}"`` per prompt, seeds ``seed + i``) is
``engine.fan_out``'s.
"""

from __future__ import annotations

from engine.outputs import RequestOutput
from engine.outputs_processing.request_state import RequestState
from engine.sampling_params import RequestOutputKind


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
        kind = children[0].params.output_kind
        self.final_only = kind == RequestOutputKind.FINAL_ONLY
        self.delta = kind == RequestOutputKind.DELTA

    @property
    def finished(self) -> bool:
        for child in self.children:
            if child.finish_reason is None:
                return False
        return True

    @property
    def has_update(self) -> bool:
        return any(c.has_update for c in self.children)

    def take_output(self) -> RequestOutput:
        """All n completions (cumulative) with each one's delta since the last output."""
        children = self.children
        first = children[0]
        if len(children) == 1:  # n == 1: every step of every request comes through here
            outputs = [first.take_output()]
            finished = first.finish_reason is not None
            error = first.error or None
        else:
            outputs = [c.take_output() for c in children]
            finished = self.finished
            errors = [c.error for c in children if c.error]
            error = errors[0] if errors else None
        prompt_logprobs = first.prompt_logprobs
        if prompt_logprobs is not None and not self.delta:
            prompt_logprobs = prompt_logprobs[:]
        return RequestOutput(
            self.request_id,
            self.prompt,
            self.prompt_token_ids,
            outputs,
            finished,
            prompt_logprobs,
            first.num_cached_tokens,
            error,
            first.pooled,
        )
