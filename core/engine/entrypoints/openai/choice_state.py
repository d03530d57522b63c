"""Per-choice progress of a response: what was already sent, what an update adds.

The server asks the engine for deltas (``RequestOutputKind.DELTA``, set by
``EngineStream``) and builds each choice's cumulative text here, once: a streamed choice
writes each delta out as it arrives, a non-streamed one keeps the sum for the response.
An update that repeats an unchanged choice (n > 1) carries an empty delta and adds nothing.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from engine.outputs import CompletionOutput, Logprobs, RequestOutput


@dataclass
class ChoiceDelta:
    text: str
    token_ids: list[int]
    logprobs: list[Logprobs]
    finish_reason: str | None
    stop_reason: int | str | None


@dataclass
class ChoiceState:
    index: int
    text: str = ""
    token_ids: list[int] = field(default_factory=list)
    logprobs: list[Logprobs] = field(default_factory=list)
    finish_reason: str | None = None
    stop_reason: int | str | None = None

    @property
    def finished(self) -> bool:
        return self.finish_reason is not None

    def advance(self, out: CompletionOutput) -> ChoiceDelta | None:
        """Take an output's delta; return it (or None when it adds nothing)."""
        if self.finished:
            return None
        new_text, new_ids = out.delta_text, out.delta_token_ids
        new_lps = out.delta_logprobs or []
        newly_finished = out.finish_reason is not None
        if not (new_text or new_ids or newly_finished):
            return None
        self.text += new_text
        self.token_ids += new_ids
        self.logprobs += new_lps
        if newly_finished:
            self.finish_reason = out.finish_reason
            self.stop_reason = out.stop_reason
        return ChoiceDelta(
            new_text,
            new_ids,
            new_lps,
            out.finish_reason,
            out.stop_reason if newly_finished else None,
        )

    def force_finish(self, reason: str) -> ChoiceDelta | None:
        """End a choice the engine left open (server abort): ``finish_reason`` ``reason``."""
        if self.finished:
            return None
        self.finish_reason = reason
        return ChoiceDelta("", [], [], reason, None)


def advance_all(
    states: list[ChoiceState], out: RequestOutput, index_base: int = 0
) -> dict[int, ChoiceDelta]:
    """Advance the choices an update mentions; ``index_base`` offsets a batch prompt's."""
    deltas = {}
    for completion in out.outputs:
        index = index_base + completion.index
        delta = states[index].advance(completion)
        if delta is not None:
            deltas[index] = delta
    return deltas


def finish_open(states: list[ChoiceState], reason: str = "abort") -> None:
    for s in states:
        s.force_finish(reason)


def record_finish(tracker: Any, states: list[ChoiceState], num_prompt_tokens: int) -> None:
    """Per-request metrics fallback; prompt tokens count once per prompt."""
    for i, s in enumerate(states):
        tracker.on_finish(
            s.finish_reason or "abort", num_prompt_tokens if i == 0 else 0, len(s.token_ids)
        )
