"""top-k, top-p and min-p masks, exactly, against Hugging Face's warpers and plain loops."""

from __future__ import annotations

import math

import pytest
import torch
from engine.model_executor.topk_topp import apply_min_p, apply_top_k_top_p
from transformers.generation.logits_process import (
    MinPLogitsWarper,
    TopKLogitsWarper,
    TopPLogitsWarper,
)

VOCAB_SIZE = 64
NEG_INF = float("-inf")


def _logits(num_rows: int, seed: int) -> torch.Tensor:
    gen = torch.Generator().manual_seed(seed)
    return torch.randn(num_rows, VOCAB_SIZE, generator=gen) * 2


def _kept(logits: torch.Tensor) -> list[set[int]]:
    return [set(torch.nonzero(row > NEG_INF).flatten().tolist()) for row in logits]


def _ref_top_p(row: list[float], top_p: float) -> set[int]:
    """Smallest set of most likely tokens with total probability >= top_p (float64)."""
    peak = max(row)
    weights = [math.exp(x - peak) for x in row]
    total = sum(weights)
    order = sorted(range(len(row)), key=lambda i: -row[i])
    kept, mass = set(), 0.0
    for token in order:
        kept.add(token)
        mass += weights[token] / total
        if mass >= top_p:
            break
    return kept


def test_top_k_matches_hugging_face_per_row() -> None:
    logits = _logits(6, 0)
    ks = [1, 2, 5, 17, VOCAB_SIZE - 1, VOCAB_SIZE]  # VOCAB_SIZE = off
    top_k = torch.tensor(ks)
    for max_top_k in (None, VOCAB_SIZE - 1):
        ours = apply_top_k_top_p(logits, top_k, None, max_top_k)
        for row, k in enumerate(ks):
            expected = TopKLogitsWarper(k)(None, logits[row : row + 1])[0]
            assert torch.equal(ours[row], expected), (row, k, max_top_k)
            assert len(_kept(ours[row : row + 1])[0]) == k


def test_top_k_keeps_ties_at_the_kth_value() -> None:
    logits = torch.tensor([[1.0, 3.0, 2.0, 2.0, 0.0]])
    ours = apply_top_k_top_p(logits, torch.tensor([2]), None, 2)
    assert _kept(ours) == [{1, 2, 3}]


def test_top_p_matches_hugging_face_and_the_definition() -> None:
    logits = _logits(5, 1)
    ps = [0.05, 0.3, 0.5, 0.9, 1.0]
    ours = apply_top_k_top_p(logits, None, torch.tensor(ps))
    for row, p in enumerate(ps):
        expected = TopPLogitsWarper(p)(None, logits[row : row + 1])[0]
        assert torch.equal(ours[row], expected), (row, p)
        assert _kept(ours[row : row + 1])[0] == _ref_top_p(logits[row].tolist(), p)
    assert torch.equal(ours[4], logits[4])  # top_p = 1 is off


def test_top_k_then_top_p_matches_hugging_face_chain() -> None:
    logits = _logits(4, 2)
    ks = [3, 10, VOCAB_SIZE, 30]
    ps = [0.5, 0.8, 0.7, 1.0]
    ours = apply_top_k_top_p(logits, torch.tensor(ks), torch.tensor(ps), max(ks))
    for row in range(4):
        scores = logits[row : row + 1]
        scores = TopKLogitsWarper(ks[row])(None, scores)
        scores = TopPLogitsWarper(ps[row])(None, scores)
        assert torch.equal(ours[row], scores[0]), row


def test_min_p_matches_hugging_face_and_the_definition() -> None:
    logits = _logits(4, 3)
    min_ps = [0.0, 0.05, 0.3, 1.0]
    ours = apply_min_p(logits, torch.tensor(min_ps))
    for row, min_p in enumerate(min_ps):
        if min_p > 0:
            expected = MinPLogitsWarper(min_p)(None, logits[row : row + 1])[0]
            assert torch.equal(ours[row], expected), row
        probs = logits[row].double().softmax(-1)
        reference = set(torch.nonzero(probs >= min_p * probs.max() - 1e-12).flatten().tolist())
        assert _kept(ours[row : row + 1])[0] == reference
    assert torch.equal(ours[0], logits[0])
    assert _kept(ours[3:])[0] == {int(logits[3].argmax())}


@pytest.mark.parametrize("use_top_p", [False, True])
def test_rows_that_switch_truncation_off_are_unchanged(use_top_p: bool) -> None:
    logits = _logits(3, 4)
    top_k = torch.tensor([VOCAB_SIZE, 4, VOCAB_SIZE])
    top_p = torch.tensor([1.0, 1.0, 1.0]) if use_top_p else None
    ours = apply_top_k_top_p(logits, top_k, top_p, 4)
    assert torch.equal(ours[0], logits[0])
    assert torch.equal(ours[2], logits[2])
    assert len(_kept(ours[1:2])[0]) == 4
