"""Packed device masks: the bits equal the widened bool masks, one entry per grammar
state is built and reused, and the sampler applies packed rows like bool rows."""

from __future__ import annotations

import torch
from engine.model_executor.logit_masks import apply_allowed_token_masks
from engine.structured_output.masks import DeviceMaskCache, EosRules, unpack_masks
from structured_output_fakes import FixedMatcher

VOCAB = 37  # not a multiple of 8: the last byte is partly padding
DEVICE = torch.device("cuda" if torch.cuda.is_available() else "cpu")


def test_packed_bits_equal_the_widened_masks() -> None:
    rules = EosRules([3, 30])
    cache = DeviceMaskCache(rules, DEVICE)
    matchers = [
        FixedMatcher(VOCAB, [0, 5, 30]),  # may end: both EOS ids allowed
        FixedMatcher(VOCAB, [1, 2, 36]),  # may not end
        FixedMatcher(VOCAB, [], terminated=True),  # EOS only
        FixedMatcher(VOCAB - 5, [4, 31]),  # backend vocab smaller: the rest forbidden
    ]
    for matcher in matchers:
        packed = cache.packed(matcher, VOCAB)
        assert packed is not None and packed.dtype == torch.uint8 and packed.shape == (5,)
        assert packed.device.type == DEVICE.type
        got = unpack_masks(packed[None, :], VOCAB)[0].cpu()
        assert torch.equal(got, rules.widen(matcher, VOCAB))


def test_one_entry_per_state_reused_and_rebuilt_when_the_state_object_changes() -> None:
    cache = DeviceMaskCache(EosRules([3]), torch.device("cpu"), max_entries=2)
    a, b = FixedMatcher(VOCAB, [1]), FixedMatcher(VOCAB, [2])
    first = cache.packed(a, VOCAB)
    assert cache.packed(a, VOCAB) is first and len(cache) == 1
    cache.packed(b, VOCAB)
    cache.packed(FixedMatcher(VOCAB, [9]), VOCAB)  # evicts a's entry (least recently used)
    assert len(cache) == 2 and cache.packed(a, VOCAB) is not first
    a.mask = torch.zeros(VOCAB, dtype=torch.bool)  # a new state object for the same matcher
    a.mask[7] = True
    assert unpack_masks(cache.packed(a, VOCAB)[None, :], VOCAB)[0].nonzero().flatten().tolist() == [
        7
    ]


def test_sampler_applies_packed_rows_like_bool_rows() -> None:
    rules = EosRules([3])
    cache = DeviceMaskCache(rules, DEVICE)
    matchers = [FixedMatcher(VOCAB, [0, 4, 8]), None, FixedMatcher(VOCAB, [36])]
    logits = torch.randn(3, VOCAB, device=DEVICE)
    packed = apply_allowed_token_masks(
        logits.clone(), [None if m is None else cache.packed(m, VOCAB) for m in matchers]
    )
    plain = apply_allowed_token_masks(
        logits.clone(), [None if m is None else rules.widen(m, VOCAB) for m in matchers]
    )
    assert torch.equal(packed, plain) and packed.device.type == DEVICE.type
    assert torch.isinf(packed[0]).sum() == VOCAB - 3 and not torch.isinf(packed[1]).any()
