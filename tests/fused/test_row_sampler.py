"""``RowSampler``: one launch for plain decode rows (greedy: the argmax, ties to the lowest
id; temperature > 0: a sample of softmax(logits / T) by Gumbel-max), its counters back at
zero and its step key advanced by every launch (Triton's interpreter on CPU)."""

from __future__ import annotations

import math

import torch
from engine_sdk.layers.sampling import BLOCK, RowSampler, sample_rows_reference

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"
VOCAB = 2 * BLOCK + 1808  # three chunks, the last one partial


def test_greedy_rows_are_the_argmax_with_ties_to_the_lowest_id():
    gen = torch.Generator().manual_seed(0)
    logits = torch.randn(4, VOCAB, generator=gen)
    logits[1, [5000, 9000, 300]] = 50.0  # a tie across chunks and ids: 300 wins
    logits[2, [BLOCK + 7, BLOCK + 3]] = 50.0  # a tie inside one chunk: BLOCK + 3
    logits[3, VOCAB - 1] = 50.0  # the last id of the partial chunk
    logits = logits.to(DEVICE)
    sampler = RowSampler(8, VOCAB, torch.device(DEVICE))
    step = int(sampler.step.item())
    got = sampler(logits, torch.zeros(4, device=DEVICE))
    assert got.tolist() == logits.argmax(dim=-1).tolist()
    assert got.tolist()[1:] == [300, BLOCK + 3, VOCAB - 1]
    assert not sampler.locks.any()  # every counter back at zero
    assert int(sampler.step.item()) == step + 1  # the launch advanced the noise key


def test_random_rows_follow_softmax_over_temperature():
    """Four tokens in three chunks carry the mass; row 0 at T = 1, row 1 at T = 2 (probs
    proportional to p ** 0.5), row 2 greedy in the same launch; frequencies over many
    launches within 4.5 standard deviations of the expected ones."""
    probs = torch.tensor([0.1, 0.2, 0.3, 0.4])
    ids = [10, BLOCK + 1, 2 * BLOCK + 5, BLOCK + 2]
    logits = torch.full((3, VOCAB), -1e4)
    logits[:, ids] = probs.log()
    logits = logits.to(DEVICE)
    temps = torch.tensor([1.0, 2.0, 0.0], device=DEVICE)
    sampler = RowSampler(4, VOCAB, torch.device(DEVICE))
    draws = 500
    counts = torch.zeros(2, 4)
    for _ in range(draws):
        got = sampler(logits, temps).tolist()
        assert got[2] == ids[3]  # the greedy row never moves
        for row in range(2):
            counts[row, ids.index(got[row])] += 1
    for row, t in ((0, 1.0), (1, 2.0)):
        want = probs ** (1 / t) / (probs ** (1 / t)).sum()
        sd = (want * (1 - want) * draws).sqrt()
        err = (counts[row] - want * draws).abs()
        assert bool((err <= 4.5 * sd).all()), (row, counts[row], want * draws)
    assert not torch.equal(counts[0], counts[1])


def test_rows_and_launches_draw_independent_noise():
    """Identical rows of a flat distribution: the rows of one launch, and one row over
    launches, land on different ids (the noise depends on the row and on the step)."""
    logits = torch.zeros(6, VOCAB, device=DEVICE)
    sampler = RowSampler(8, VOCAB, torch.device(DEVICE))
    temps = torch.ones(6, device=DEVICE)
    first = sampler(logits, temps).tolist()
    second = sampler(logits, temps).tolist()
    assert len(set(first)) >= 5  # 6 draws of VOCAB equal choices: collisions are rare
    assert first != second


def test_reference_has_the_same_greedy_rows_and_a_fair_sample():
    gen = torch.Generator().manual_seed(3)
    logits = torch.randn(3, 64, generator=gen)
    temps = torch.tensor([0.0, 1.0, 0.0])
    got = sample_rows_reference(logits, temps, gen)
    assert got[0] == logits[0].argmax() and got[2] == logits[2].argmax()
    flat = torch.zeros(1, 64)
    seen = {int(sample_rows_reference(flat, torch.ones(1), gen)) for _ in range(200)}
    assert len(seen) > 64 * (1 - math.exp(-200 / 64)) * 0.8  # about as many ids as expected


def _packed(allowed: torch.Tensor) -> torch.Tensor:
    """uint8 [rows, bytes] with bit (id % 8) of byte (id // 8) set where ``allowed``."""
    rows, vocab = allowed.shape
    padded = torch.zeros(rows, -(-vocab // 32) * 32, dtype=torch.bool)
    padded[:, :vocab] = allowed
    weights = 1 << torch.arange(8)
    return (padded.view(rows, -1, 8).long() * weights).sum(-1).to(torch.uint8)


def test_masked_rows_draw_only_allowed_ids():
    """With packed masks: greedy rows are the argmax over the allowed ids (not the row's
    larger forbidden maximum), random rows follow softmax over the allowed ids only; the
    torch reference agrees on the greedy rows."""
    probs = torch.tensor([0.1, 0.2, 0.3, 0.4])
    ids = [10, BLOCK + 1, 2 * BLOCK + 5, BLOCK + 2]
    logits = torch.full((3, VOCAB), -1e4)
    logits[:, ids] = probs.log()
    logits[:, 7] = 5.0  # the largest logit of every row, forbidden in all three
    allowed = torch.zeros(3, VOCAB, dtype=torch.bool)
    allowed[:, ids] = True
    allowed[1, ids[3]] = False  # row 1: the three others, renormalized
    allowed[2, ids[3]] = False  # row 2 (greedy): the best allowed is ids[2]
    bits = _packed(allowed).to(DEVICE)
    logits = logits.to(DEVICE)
    temps = torch.tensor([1.0, 1.0, 0.0], device=DEVICE)
    sampler = RowSampler(4, VOCAB, torch.device(DEVICE))
    want_greedy = sample_rows_reference(logits, temps, allowed_bits=bits)[2].item()
    assert want_greedy == ids[2]
    draws = 400
    counts = torch.zeros(2, 4)
    for _ in range(draws):
        got = sampler(logits, temps, bits).tolist()
        assert got[2] == ids[2]
        for row in range(2):
            assert got[row] in ids and allowed[row, got[row]]
            counts[row, ids.index(got[row])] += 1
    assert not sampler.locks.any()
    for row in range(2):
        want = torch.where(allowed[row, ids], probs, torch.zeros(4))
        want = want / want.sum()
        sd = (want * (1 - want) * draws).sqrt()
        err = (counts[row] - want * draws).abs()
        assert bool((err <= 4.5 * sd + 1e-9).all()), (row, counts[row], want * draws)
    assert counts[1, 3] == 0
