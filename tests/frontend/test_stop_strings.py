"""Stop strings: found across token boundaries, never shown, never partly streamed."""

from __future__ import annotations

import itertools
from typing import Any

import pytest
from engine.tokenization import IncrementalDetokenizer, StopStringChecker

TEXT = "The answer is 42.\nEND of story ### more"


def _stream(checker: StopStringChecker, pieces: list[str]) -> tuple[list[str], str | None]:
    deltas = []
    for piece in pieces:
        res = checker.update(piece)
        deltas.append(res.delta_text)
        if res.stop_string is not None:
            return deltas, res.stop_string
    deltas.append(checker.flush())
    return deltas, None


def _splits(text: str, num_cuts: int) -> list[list[str]]:
    out = []
    for cuts in itertools.combinations(range(1, len(text)), num_cuts):
        bounds = [0, *cuts, len(text)]
        out.append([text[a:b] for a, b in itertools.pairwise(bounds)])
    return out


@pytest.mark.parametrize("stop", ["\nEND", "END of", "42", "s", "###"])
def test_every_split_of_the_text_hides_the_stop_string(stop: str) -> None:
    expected = TEXT[: TEXT.index(stop)]
    for pieces in _splits(TEXT, 1) + _splits(TEXT, 2) + [list(TEXT)]:
        checker = StopStringChecker([stop, "never matches"])
        deltas, matched = _stream(checker, pieces)
        assert matched == stop
        assert "".join(deltas) == expected
        # Streaming never shows any part of the stop string: every delta ends before it.
        shown = ""
        for d in deltas:
            shown += d
            assert TEXT.startswith(shown) and len(shown) <= len(expected)


def test_include_stop_str_in_output() -> None:
    for pieces in _splits(TEXT, 1) + [list(TEXT)]:
        checker = StopStringChecker(["\nEND"], include_stop_str_in_output=True)
        deltas, matched = _stream(checker, pieces)
        assert matched == "\nEND"
        assert "".join(deltas) == "The answer is 42.\nEND"


def test_earliest_stop_string_wins() -> None:
    checker = StopStringChecker(["of story", "42"])
    deltas, matched = _stream(checker, [TEXT])
    assert matched == "42" and "".join(deltas) == "The answer is "


def test_held_back_prefix_is_released_when_it_does_not_match() -> None:
    checker = StopStringChecker(["\nEND"])
    assert checker.update("abc\nE").delta_text == "abc"  # "\nE" could become "\nEND"
    assert checker.update("X").delta_text == "\nEX"
    assert checker.update("\nEN").delta_text == ""
    assert checker.flush() == "\nEN"  # finished for another reason: nothing to hide


def test_no_stop_strings_releases_everything() -> None:
    checker = StopStringChecker([])
    assert checker.update("abc").delta_text == "abc"
    assert checker.stopped is None


@pytest.mark.parametrize("stop", ["END", "\nEND", "😀", "世界 😀", "##"])
def test_stop_strings_spanning_tokens(any_tokenizer: Any, stop: str) -> None:
    """Detokenizer + checker, one token at a time, as the output processor runs them."""
    tok = any_tokenizer
    text = "héllo 世界 😀 the answer\nEND ## tail"
    ids = tok.encode(text, add_special_tokens=False)
    full = tok.decode(ids, skip_special_tokens=True)
    prompt = ids[:1]
    detok = IncrementalDetokenizer(tok, prompt)
    checker = StopStringChecker([stop])
    prompt_text = tok.decode(prompt)
    shown = prompt_text
    for t in ids[1:]:
        res = checker.update(detok.update([t]))
        shown += res.delta_text
        assert stop not in shown
        assert full.startswith(shown)
        if res.stop_string:
            break
    assert res.stop_string == stop
    assert shown == full[: full.index(stop, len(prompt_text))]
