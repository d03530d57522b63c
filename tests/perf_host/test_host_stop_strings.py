"""The windowed held-back search of ``StopStringChecker`` equals the per-length scan."""

from __future__ import annotations

import random

import pytest
from engine.tokenization import StopStringChecker


def reference_held_back(text: str, stops: list[str]) -> int:
    """Longest suffix of ``text`` that is a proper prefix of some stop string."""
    max_len = max((len(s) for s in stops), default=0)
    for length in range(min(max_len - 1, len(text)), 0, -1):
        if any(s.startswith(text[len(text) - length :]) for s in stops):
            return length
    return 0


@pytest.mark.parametrize("seed", range(30))
def test_held_back_length_matches_the_scan(seed: int) -> None:
    rng = random.Random(seed)
    alphabet = "ab\n世"
    stops = ["".join(rng.choice(alphabet) for _ in range(rng.randrange(1, 7))) for _ in range(3)]
    for _ in range(200):
        text = "".join(rng.choice(alphabet) for _ in range(rng.randrange(0, 12)))
        if any(s in text for s in stops):
            continue  # the checker only asks once no stop string matched
        checker = StopStringChecker(stops)
        checker.text = text
        assert checker._held_back_len() == reference_held_back(text, stops), (text, stops)


@pytest.mark.parametrize("seed", range(10))
def test_streams_release_all_text_before_the_first_stop(seed: int) -> None:
    rng = random.Random(seed)
    stops = ["aab", "ba\n", "世a"]
    text = "".join(rng.choice("ab\n世") for _ in range(60))
    ends = [text.find(s) for s in stops if s in text]
    expected = text[: min(ends)] if ends else text
    checker = StopStringChecker(stops)
    shown, i = "", 0
    while i < len(text) and checker.stopped is None:
        n = rng.randrange(1, 4)
        result = checker.update(text[i : i + n])
        shown += result.delta_text
        i += n
        # Released text never includes a stop string nor text that could start one.
        assert expected.startswith(shown)
        if checker.stopped is None:
            assert len(shown) == len(checker.text) - reference_held_back(checker.text, stops)
    if checker.stopped is None:
        shown += checker.flush()
    assert shown == expected
