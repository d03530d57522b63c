"""Conformance checks for a structured-output backend's matchers (imports torch).

``assert_matcher_conforms(grammar, vocab_size)`` walks the grammar with random allowed
tokens and checks the optional ``GrammarMatcher`` methods against the abstract ones, at
every step of every walk:

- ``fill_bitmask``, where it returns True, writes exactly ``allowed_token_ids()``;
- equal ``state_key`` values (over all walks) come with equal masks and equal
  ``is_terminated()``: the engine shares one mask per key, so a key that names two
  different masks would give a request another request's mask;
- ``accept_token`` refuses a sample of the ids the mask forbids (tried on a fresh matcher
  replayed to the same point).

Use it from a plugin's tests::

    def test_matchers_conform(backend):
        grammar = backend.compile("json", '{"type": "object"}')
        assert_matcher_conforms(grammar, backend.vocab_size, eos_token_id=backend.eos_id)
"""

from __future__ import annotations

import random
from collections.abc import Hashable
from dataclasses import dataclass, field

import torch

from engine_sdk.interfaces.structured_output import CompiledGrammar, GrammarMatcher


@dataclass
class MatcherReport:
    """What the walks saw: keyed steps, distinct keys, and whether the optional methods
    are implemented (``None`` keys / ``False`` fills are allowed, just not shared)."""

    num_steps: int = 0
    num_keyed_steps: int = 0
    num_filled_steps: int = 0
    keys: dict[Hashable, tuple[torch.Tensor, bool]] = field(default_factory=dict)


def unpack_bitmask(words: torch.Tensor, vocab_size: int) -> torch.Tensor:
    """bool ``[vocab_size]`` from ``fill_bitmask``'s int32 words (bit ``id % 32`` of word
    ``id // 32``)."""
    shifts = torch.arange(32, dtype=torch.int64)
    bits = (words.to(torch.int64)[:, None] >> shifts) & 1
    return bits.flatten()[:vocab_size].bool()


def _check_step(
    matcher: GrammarMatcher, vocab_size: int, report: MatcherReport, where: str
) -> torch.Tensor | None:
    mask = matcher.allowed_token_ids()
    terminated = matcher.is_terminated()
    report.num_steps += 1
    if mask is None:
        return None
    if not terminated:
        words = torch.zeros(-(-vocab_size // 32), dtype=torch.int32)
        if matcher.fill_bitmask(words):
            report.num_filled_steps += 1
            filled = unpack_bitmask(words, vocab_size)
            expected = torch.zeros(vocab_size, dtype=torch.bool)
            expected[: min(vocab_size, mask.shape[0])] = mask[:vocab_size]
            assert torch.equal(filled, expected), (
                f"{where}: fill_bitmask wrote ids {filled.nonzero().flatten().tolist()[:8]}..., "
                f"allowed_token_ids() allows {expected.nonzero().flatten().tolist()[:8]}..."
            )
    key = matcher.state_key()
    if key is not None:
        report.num_keyed_steps += 1
        seen = report.keys.get(key)
        if seen is None:
            report.keys[key] = (mask.clone(), terminated)
        else:
            assert torch.equal(seen[0], mask) and seen[1] == terminated, (
                f"{where}: state_key {key!r} names two different masks (or terminated "
                "flags); a key must change whenever the mask may change"
            )
    return mask


def assert_matcher_conforms(
    grammar: CompiledGrammar,
    vocab_size: int,
    *,
    eos_token_id: int | None = None,
    num_walks: int = 8,
    max_steps: int = 64,
    num_refusals: int = 4,
    seed: int = 0,
) -> MatcherReport:
    """Random walks through ``grammar`` (``vocab_size``: the backend's), checking the
    optional matcher methods at each step (see the module docstring). A walk ends at
    ``eos_token_id`` (if given), at a terminated state or after ``max_steps`` tokens."""
    rng = random.Random(seed)
    report = MatcherReport()
    for walk in range(num_walks):
        matcher = grammar.new_matcher()
        prefix: list[int] = []
        for step in range(max_steps):
            where = f"walk {walk}, step {step} (after tokens {prefix[-8:]})"
            mask = _check_step(matcher, vocab_size, report, where)
            if mask is None or matcher.is_terminated():
                break
            allowed = mask.nonzero().flatten().tolist()
            assert allowed, f"{where}: a state allows no token"
            forbidden = (~mask).nonzero().flatten().tolist()
            for token_id in rng.sample(forbidden, min(num_refusals, len(forbidden))):
                replay = grammar.new_matcher()
                for earlier in prefix:
                    assert replay.accept_token(earlier), f"{where}: replay refused {earlier}"
                assert not replay.accept_token(token_id), (
                    f"{where}: accept_token accepted {token_id}, which the mask forbids"
                )
            token_id = rng.choice(allowed)
            assert matcher.accept_token(token_id), f"{where}: refused allowed token {token_id}"
            if token_id == eos_token_id:
                _check_step(matcher, vocab_size, report, f"{where}, after EOS")
                break
            prefix.append(token_id)
    return report
