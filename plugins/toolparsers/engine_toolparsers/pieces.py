"""Pieces a format splits a model output into, and how pieces become content + calls.

Every parser in this package only has to cut the text into pieces; the streaming and
non-streaming results are both assembled from those pieces here, which is what keeps them
equal for any split of the text into chunks.

    "Let me check.\\n<tool_call>{..}</tool_call>\\n<tool_call>{..}</tool_call>\\nDone"
     └─ TEXT ─────────┘└─ CALL ────────────────┘└┘└─ CALL ────────────────┘└ TEXT ┘
                                               TEXT ("\\n", dropped: only whitespace)

- A ``TEXT`` piece is content. A block that failed to parse is a ``TEXT`` piece holding its
  raw text, so malformed output degrades to plain content.
- A ``PENDING`` piece is an undecided tail (a partial start marker, an unclosed block). Only
  cutting a non-final text produces one, and only as the last piece.
- Content is built from runs of consecutive ``TEXT`` pieces ("groups"): a group is
  right-stripped when a call follows it and left-stripped when a call precedes it; non-empty
  groups are joined with ``"\\n"``. Without any call the content is the output unchanged.

Cutting must be prefix-stable: the decided pieces of a prefix of the text are a prefix of
the pieces of the whole text (the last ``TEXT`` piece may still grow). Then the assembled
result of a prefix is a prefix of the final result and can be streamed as a diff.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import Enum


class PieceKind(Enum):
    TEXT = "text"
    CALL = "call"
    PENDING = "pending"


@dataclass(frozen=True)
class ParsedCall:
    """A complete, valid call: ``arguments`` is the final JSON string of the arguments."""

    name: str
    arguments: str


@dataclass(frozen=True)
class Piece:
    kind: PieceKind
    text: str
    call: ParsedCall | None = None


def text_piece(text: str) -> Piece:
    return Piece(PieceKind.TEXT, text)


def call_piece(raw: str, call: ParsedCall) -> Piece:
    return Piece(PieceKind.CALL, raw, call)


def pending_piece(text: str) -> Piece:
    return Piece(PieceKind.PENDING, text)


def assemble(pieces: list[Piece], final: bool) -> tuple[str, list[ParsedCall]]:
    """Return ``(content, calls)`` for ``pieces``.

    With ``final=False`` the result is the part that can no longer change: the trailing
    whitespace of the last group is held back, because a call may still follow it.
    """
    groups: list[str] = []
    calls: list[ParsedCall] = []
    run: list[str] = []
    after_call = False
    for piece in pieces:
        if piece.kind is PieceKind.CALL:
            _close_group(groups, run, lstrip=after_call, rstrip=True)
            run = []
            assert piece.call is not None
            calls.append(piece.call)
            after_call = True
        elif piece.kind is PieceKind.TEXT:
            run.append(piece.text)
        else:
            break  # PENDING is always last; what it becomes is not known yet
    _close_group(groups, run, lstrip=after_call, rstrip=not final)
    return "\n".join(groups), calls


def _close_group(groups: list[str], run: list[str], lstrip: bool, rstrip: bool) -> None:
    text = "".join(run)
    if lstrip:
        text = text.lstrip()
    if rstrip:
        text = text.rstrip()
    if text:
        groups.append(text)


def partial_marker_start(text: str, markers: tuple[str, ...], start: int = 0) -> int | None:
    """Index where a suffix of ``text[start:]`` begins that could grow into one of ``markers``.

    ``"Hi <tool_c"`` with marker ``"<tool_call>"`` gives 3. Only proper prefixes count: a
    whole marker is found by the caller's search, not here.
    """
    best: int | None = None
    for marker in markers:
        for length in range(min(len(marker) - 1, len(text) - start), 0, -1):
            if text.endswith(marker[:length]):
                pos = len(text) - length
                if best is None or pos < best:
                    best = pos
                break
    return best


def find_first(text: str, markers: tuple[str, ...], start: int) -> tuple[int, str] | None:
    """The earliest complete occurrence of any marker at or after ``start``."""
    found: tuple[int, str] | None = None
    for marker in markers:
        pos = text.find(marker, start)
        if pos >= 0 and (found is None or pos < found[0]):
            found = (pos, marker)
    return found
