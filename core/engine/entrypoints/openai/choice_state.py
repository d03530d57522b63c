"""Per-choice progress of a response: what was already sent, what an update adds.

The server diffs the engine's cumulative ``CompletionOutput`` (``text``, ``token_ids``,
``logprobs``) against what it has sent, rather than trusting per-update deltas, so an update
that repeats an unchanged choice (n > 1) never duplicates text.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from engine.core.scheduler_output import Logprobs
from engine.outputs import CompletionOutput, RequestOutput


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
        """Take a cumulative output; return what is new since the last call (or None)."""
        if self.finished:
            return None
        new_text = out.text[len(self.text) :] if out.text.startswith(self.text) else out.text
        new_ids = list(out.token_ids[len(self.token_ids) :])
        new_lps = list((out.logprobs or [])[len(self.logprobs) :])
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
