"""Cached packed masks equal today's uncached masks over random walks of real grammars.

A batch of outlines matchers under two JSON schemas and a regex walks randomly (each step
a random token the uncached mask allows, EOS restarting the row). At every step the rows
of the mask table (``packed_masks``: built once per grammar state, then shared) must be
exactly the masks built from scratch (``batch_masks``: the backend's bool mask and the EOS
rules, every step). The walks meet the case a cache gets wrong most easily: the same
outlines state number in two grammars with different masks; a key without the grammar
would hand one grammar's row to the other, and the comparison catches it.
"""

from __future__ import annotations

import random
from typing import Any

import pytest
import torch
from engine.sampling_params import StructuredOutputsParams as Params
from engine.structured_output.bound_matcher import BoundMatcher
from structured_output_fakes import ManagerFactory

CONSTRAINTS = [
    Params(json={"type": "object", "properties": {"a": {"type": "integer"}}, "required": ["a"]}),
    Params(
        json={
            "type": "object",
            "properties": {"name": {"type": "string", "maxLength": 6}, "ok": {"type": "boolean"}},
            "required": ["name", "ok"],
        }
    ),
    Params(regex=r"[0-9]{1,3}(\.[0-9])? (EUR|USD)"),
]
ROWS_PER_CONSTRAINT = 6
NUM_STEPS = 60
PADDING = 8  # logits wider than the tokenizer, as padded checkpoints are


def walk_and_compare(manager: Any, seed: int) -> tuple[int, int]:
    """Walk; return (steps whose cached rows differed from the uncached masks, steps where
    two grammars shared a backend state number with different masks)."""
    rng = random.Random(seed)
    vocab_size = manager.vocab_size + PADDING
    constraints = [c for c in CONSTRAINTS for _ in range(ROWS_PER_CONSTRAINT)]
    matchers = [manager.matcher_for(c) for c in constraints]
    num_wrong = num_collisions = 0
    for _ in range(NUM_STEPS):
        uncached = manager.batch_masks(matchers, vocab_size)
        cached = ~manager.packed_masks(matchers, vocab_size, torch.device("cpu")).forbidden()
        if not all(torch.equal(cached[i], mask) for i, mask in enumerate(uncached)):
            num_wrong += 1
        num_collisions += _collisions(matchers, uncached)
        for i, mask in enumerate(uncached):
            assert mask is not None
            token_id = rng.choice(mask.nonzero().flatten().tolist())
            if manager.eos_rules.is_eos(token_id):
                matchers[i] = manager.matcher_for(constraints[i])
            else:
                assert manager.accept_token(matchers[i], token_id)
    return num_wrong, num_collisions


def _collisions(matchers: list[Any], masks: list[Any]) -> int:
    """1 if two rows of different grammars have the same backend key but other masks."""
    by_key: dict[Any, tuple[int | None, torch.Tensor]] = {}
    for matcher, mask in zip(matchers, masks, strict=True):
        assert isinstance(matcher, BoundMatcher)
        seen = by_key.setdefault(matcher.inner.state_key(), (matcher.grammar_serial, mask))
        if seen[0] != matcher.grammar_serial and not torch.equal(seen[1], mask):
            return 1
    return 0


@pytest.mark.parametrize("seed", [0, 1])
def test_cached_rows_equal_uncached_masks_over_random_walks(
    make_manager: ManagerFactory, seed: int
) -> None:
    manager = make_manager()
    num_wrong, num_collisions = walk_and_compare(manager, seed)
    assert num_wrong == 0
    assert num_collisions > 0, "the walks never met the same state number in two grammars"
    table = manager.mask_table(manager.vocab_size + PADDING, torch.device("cpu"))
    rows = len(CONSTRAINTS) * ROWS_PER_CONSTRAINT
    assert table.num_builds < NUM_STEPS * rows / 4, "rows are not shared across steps"


def test_a_key_without_the_grammar_would_be_caught(
    make_manager: ManagerFactory, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The comparison above has teeth: with the backend's key alone (no grammar serial),
    rows of one grammar are served to another and the walk sees wrong masks."""
    monkeypatch.setattr(BoundMatcher, "state_key", lambda self: self.inner.state_key())
    num_wrong, _ = walk_and_compare(make_manager(), seed=0)
    assert num_wrong > 0
