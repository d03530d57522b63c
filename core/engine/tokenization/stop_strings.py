"""Stop strings over streamed text: find them across token boundaries, never leak them.

The checker receives the detokenizer's text deltas. It keeps the whole output text and
how much of it was already released to the caller. After each delta it

1. looks for a stop string that ends inside the new text (a match may start in older,
   held-back text, so the search starts ``len(stop) - 1`` characters before the delta);
2. on a match, truncates the text before the stop string (or after it with
   ``include_stop_str_in_output``) and reports the stop string;
3. otherwise releases everything except the longest suffix that is a proper prefix of some
   stop string: that suffix could still become a stop string with the next token, so a
   streaming client must not see it yet.

    text:  "... the answer is 42\\nEN"     stop = ["\\nEND"]
                                 ^^^ held back: could grow into "\\nEND"
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass
class StopResult:
    delta_text: str  # text released to the caller by this update
    stop_string: str | None = None  # the stop string that matched, if any


class StopStringChecker:
    """Release text while hiding stop strings and anything that could grow into one."""

    def __init__(self, stop: list[str], include_stop_str_in_output: bool = False) -> None:
        self._stop = [s for s in stop if s]
        self._include = include_stop_str_in_output
        self._max_len = max((len(s) for s in self._stop), default=0)
        self.text = ""  # all text received so far (truncated at a match)
        self.num_released = 0
        self.stopped: str | None = None

    @property
    def active(self) -> bool:
        """Whether there are stop strings at all (without them, text passes unchanged)."""
        return bool(self._stop)

    def update(self, delta: str) -> StopResult:
        """Add newly decoded text; return what may be shown now and any stop string hit."""
        assert self.stopped is None, "update() after a stop string matched"
        num_old = len(self.text)
        self.text += delta
        if not self._stop:
            return StopResult(self._release(len(self.text)))
        match = self._find_stop(num_old)
        if match is not None:
            start, stop = match
            end = start + len(stop) if self._include else start
            self.text = self.text[:end]
            self.stopped = stop
            return StopResult(self._release(end), stop)
        if self._include:
            # A stop string would be shown anyway, so there is nothing to hide.
            return StopResult(self._release(len(self.text)))
        return StopResult(self._release(len(self.text) - self._held_back_len()))

    def flush(self) -> str:
        """The sequence ended for another reason: release the held-back text."""
        return self._release(len(self.text))

    def _release(self, end: int) -> str:
        end = max(end, self.num_released)
        out = self.text[self.num_released : end]
        self.num_released = end
        return out

    def _find_stop(self, num_old: int) -> tuple[int, str] | None:
        """Earliest stop string that ends in the new text: (start index, stop string)."""
        best: tuple[int, str] | None = None
        for stop in self._stop:
            search_from = max(0, num_old - len(stop) + 1)
            idx = self.text.find(stop, search_from)
            if idx != -1 and (best is None or idx < best[0]):
                best = (idx, stop)
        return best

    def _held_back_len(self) -> int:
        """Length of the longest suffix of the text that is a proper prefix of a stop.

        Only the last ``len(stop) - 1`` characters can start such a suffix, and only where
        the stop's first character occurs, so each stop costs a ``find`` or two in that
        window rather than a comparison per suffix length:

            text "... is 42\nEN"   stop "\nEND": find "\n" in the last 3 chars -> "\nEN"
        """
        text = self.text
        num_chars = len(text)
        best = 0
        for stop in self._stop:
            first_char = stop[0]
            # Candidate starts p give suffixes of length num_chars - p in (best, len(stop)).
            p = text.find(first_char, max(0, num_chars - len(stop) + 1), num_chars - best)
            while p != -1:
                if stop.startswith(text[p:]):
                    best = num_chars - p
                    break
                p = text.find(first_char, p + 1, num_chars - best)
        return best
