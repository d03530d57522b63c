"""The runner's structured-output state: one matcher per constrained request, and where
its think section ended.

Each step the runner asks ``masks(requests)`` for the sampling rows and, after sampling,
calls ``accept(requests, token_ids)``. A matcher is kept in step with the request's output:
when the number of tokens it consumed differs from the output the scheduler reports (after
preemption, or a request first seen mid-output) it is rebuilt by replaying the output, a
cache hit because the API layer compiled the constraint before queueing the request.

Reasoning (``--reasoning-parser``): the constraint applies only to the text after the think
section. A request whose prompt already closed it (the template's ``</think>`` at the end,
e.g. Qwen3 with ``enable_thinking=False``) is constrained from its first token; otherwise
each new output token is checked by decoding a small window ending at it and asking the
parser's ``is_reasoning_end`` (one short decode per token while thinking, none after)::

    output:  <think> a b c </think> { " k " : 1 }
                             ^ end found here: constraining starts at the next token
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import torch
from engine_sdk.interfaces.reasoning_parser import ReasoningParser
from engine_sdk.interfaces.structured_output import GrammarMatcher

from engine.core.request import ReqId
from engine.core.scheduler_output import ScheduledRequest
from engine.errors import EngineError
from engine.structured_output.manager import StructuredOutputManager
from engine.structured_output.masks import PackedMasks

logger = logging.getLogger(__name__)

# Tokens decoded to look for the end of the think section (a marker spelled in several
# tokens still fits; the prompt's tail holds the template's closing marker).
REASONING_WINDOW = 16


class ReasoningGate:
    """Where a request's think section ends, in output token positions."""

    def __init__(self, parser: ReasoningParser, tokenizer: Any) -> None:
        self.parser = parser
        self.tokenizer = tokenizer

    def _ended(self, token_ids: Sequence[int]) -> bool:
        text = self.tokenizer.decode(list(token_ids), skip_special_tokens=False)
        return bool(self.parser.is_reasoning_end(text))

    def prompt_closed(self, prompt_token_ids: Sequence[int]) -> bool:
        """Whether the prompt's tail already ended the think section."""
        return self._ended(prompt_token_ids[-REASONING_WINDOW:])

    def find_end(self, output_token_ids: Sequence[int], start: int) -> int | None:
        """The output index right after the end marker, looking at tokens ``start..``."""
        for j in range(start, len(output_token_ids)):
            if self._ended(output_token_ids[max(0, j + 1 - REASONING_WINDOW) : j + 1]):
                return j + 1
        return None


@dataclass
class _RequestState:
    constrain_from: int | None  # output index where the constraint starts; None: thinking
    num_scanned: int = 0  # output tokens already searched for the end of thinking
    matcher: GrammarMatcher | None = None
    num_consumed: int = 0  # tokens the matcher has seen (from constrain_from on)
    broken: bool = False  # the output left the grammar: stop constraining, log once
    masked: bool = False  # a mask was applied in the current step


class StructuredOutputState:
    """Per-request matchers for the runner; built lazily on the first constrained request."""

    def __init__(
        self,
        manager_factory: Callable[[], StructuredOutputManager | None],
        gate_factory: Callable[[Any], ReasoningGate | None],
    ) -> None:
        self._manager_factory = manager_factory
        self._gate_factory = gate_factory
        self._manager: StructuredOutputManager | None = None
        self._gate: ReasoningGate | None = None
        self._ready = False
        self._states: dict[ReqId, _RequestState] = {}

    def set_manager(self, manager: StructuredOutputManager | None) -> None:
        """Use ``manager`` (the engine's own, sharing its compile cache)."""
        self._manager = manager
        self._manager_factory = lambda: manager

    def _setup(self) -> StructuredOutputManager:
        if not self._ready:
            if self._manager is None:
                self._manager = self._manager_factory()
            if self._manager is not None:
                self._gate = self._gate_factory(self._manager.tokenizer)
            self._ready = True
        if self._manager is None:
            raise EngineError("a request asked for structured outputs but no backend exists")
        return self._manager

    def drop(self, req_ids: Sequence[ReqId] | set[ReqId]) -> None:
        for req_id in req_ids:
            self._states.pop(req_id, None)

    def num_tracked(self) -> int:
        return len(self._states)

    def masks(
        self, requests: Sequence[ScheduledRequest], vocab_size: int, device: torch.device
    ) -> PackedMasks | None:
        """A packed mask on ``device`` per sampling row (see
        ``StructuredOutputManager.packed_masks``), or ``None`` when no row is constrained
        this step."""
        if not any(sr.request.sampling_params.structured_outputs for sr in requests):
            return None
        manager = self._setup()
        matchers: list[GrammarMatcher | None] = []
        for sr in requests:
            state = self._state_for(sr)
            matchers.append(None if state is None else self._matcher(sr, state, manager))
        if all(m is None for m in matchers):
            return None
        return manager.packed_masks(matchers, vocab_size, device)

    def accept(self, requests: Sequence[ScheduledRequest], token_ids: Sequence[int]) -> None:
        """Advance the matchers of the rows masked this step by their sampled tokens."""
        if not self._states:
            return
        assert self._manager is not None
        for sr, token_id in zip(requests, token_ids, strict=True):
            state = self._states.get(sr.req_id)
            if state is None or not state.masked or state.matcher is None:
                continue
            state.masked = False
            state.num_consumed += 1
            if not self._manager.accept_token(state.matcher, int(token_id)):
                self._break(sr.req_id, state, f"sampled token {token_id} was not accepted")

    # -- per request ------------------------------------------------------------------------

    def _state_for(self, sr: ScheduledRequest) -> _RequestState | None:
        if sr.request.sampling_params.structured_outputs is None:
            return None
        state = self._states.get(sr.req_id)
        if state is None:
            gate = self._gate
            closed = gate is None or gate.prompt_closed(sr.request.prompt_token_ids)
            state = self._states[sr.req_id] = _RequestState(0 if closed else None)
        state.masked = False
        if state.broken:
            return None
        if state.constrain_from is None:
            assert self._gate is not None
            output = sr.request.output_token_ids
            state.constrain_from = self._gate.find_end(output, state.num_scanned)
            state.num_scanned = len(output)
            if state.constrain_from is None:
                return None
        return state

    def _matcher(
        self, sr: ScheduledRequest, state: _RequestState, manager: StructuredOutputManager
    ) -> GrammarMatcher | None:
        assert state.constrain_from is not None
        output = sr.request.output_token_ids
        if state.matcher is None or state.num_consumed != len(output) - state.constrain_from:
            constrained = output[state.constrain_from :]  # copied only to replay
            try:
                state.matcher = manager.matcher_for(
                    sr.request.sampling_params.structured_outputs,  # type: ignore[arg-type]
                    constrained,
                )
            except (EngineError, ValueError) as exc:
                self._break(sr.req_id, state, str(exc))
                return None
            state.num_consumed = len(constrained)
        state.masked = True
        return state.matcher

    def _break(self, req_id: ReqId, state: _RequestState, reason: str) -> None:
        state.broken = True
        state.matcher = None
        logger.warning(
            "request %s: structured outputs stop constraining this output (%s)", req_id, reason
        )
