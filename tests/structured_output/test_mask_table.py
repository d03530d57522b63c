"""The mask table: packed rows equal the widened bool masks, one row per exact grammar
state shared by every request in it, never a row of another grammar or an evicted state,
and the sampler applies packed rows as it applies bool rows."""

from __future__ import annotations

import gc

import pytest
import torch
from engine.model_executor.logit_masks import apply_allowed_token_masks, apply_packed_masks
from engine.model_executor.sampler import Sampler, SamplingBatch
from engine.sampling_params import SamplingParams
from engine.structured_output.bound_matcher import BoundMatcher, GrammarSerials
from engine.structured_output.mask_table import PackedMaskTable
from engine.structured_output.masks import EosRules
from engine_sdk.interfaces.structured_output import GrammarMatcher
from structured_output_fakes import FixedMatcher, TableGrammar

VOCAB = 37  # not a multiple of 8 (nor of 32): the last byte is partly padding
EOS = 30
DEVICE = torch.device("cuda" if torch.cuda.is_available() else "cpu")


def _table(
    rules: EosRules, vocab: int = VOCAB, backend_vocab: int = VOCAB, **kw: int
) -> PackedMaskTable:
    return PackedMaskTable(rules, DEVICE, vocab, backend_vocab, **kw)


def _rows(table: PackedMaskTable, matchers: list[GrammarMatcher | None]) -> torch.Tensor:
    """The step's allowed ids as bool rows on the host."""
    return (~table.lookup(matchers).forbidden()).cpu()


def _expected(rules: EosRules, matcher: GrammarMatcher | None, vocab: int = VOCAB) -> torch.Tensor:
    if matcher is None:
        return torch.ones(vocab, dtype=torch.bool)
    mask = rules.widen(matcher, vocab)
    assert mask is not None
    return mask


def _chain(vocab: int, num_states: int, first_token: int, fills: bool = True) -> TableGrammar:
    """States 0..n-1; state s allows ``first_token + s + 1`` (to s + 1, the last state to
    itself) and ``first_token`` (back to 0); the last state is final: EOS allowed too."""
    transitions = {
        s: {first_token + s + 1: min(s + 1, num_states - 1), first_token: 0}
        for s in range(num_states)
    }
    return TableGrammar(vocab, transitions, {num_states - 1}, EOS, fills)


def test_packed_rows_equal_the_widened_masks() -> None:
    rules = EosRules([3, EOS])
    serials = GrammarSerials()
    table = _table(rules)
    walked = serials.bind(_chain(VOCAB, 3, 10))
    for token in (11, 12):
        assert walked.accept_token(token)  # to the final state: EOS allowed, so 3 as well
    matchers: list[GrammarMatcher | None] = [
        FixedMatcher(VOCAB, [0, 5, EOS]),  # may end: both EOS ids allowed
        FixedMatcher(VOCAB, [1, 2, 36]),  # may not end; the last id of the vocabulary
        FixedMatcher(VOCAB, [], terminated=True),  # EOS only
        FixedMatcher(VOCAB, []),  # a dead end: EOS only
        FixedMatcher(VOCAB - 5, [4, 31]),  # backend vocab smaller: the rest forbidden
        None,  # unconstrained: every id
        serials.bind(_chain(VOCAB, 3, 10)),  # filled by the backend, state 0
        walked,
        serials.bind(_chain(VOCAB, 3, 10, fills=False)),  # keyed, packed by the engine
    ]
    got = _rows(table, matchers)
    for i, matcher in enumerate(matchers):
        assert torch.equal(got[i], _expected(rules, matcher)), i


def test_backend_vocabulary_smaller_than_the_logits() -> None:
    """Bits the backend writes past its own vocabulary never reach the logits."""
    rules = EosRules([EOS])
    grammar = TableGrammar(VOCAB, {0: {2: 0, 31: 0}}, set(), EOS)  # 31: past the backend's 30
    table = _table(rules, VOCAB, backend_vocab=30)
    [row] = _rows(table, [GrammarSerials().bind(grammar)])
    assert row.nonzero().flatten().tolist() == [2]


def test_one_row_per_state_shared_by_every_request_in_it() -> None:
    rules = EosRules([EOS])
    serials = GrammarSerials()
    grammar = _chain(VOCAB, 4, 10)
    table = _table(rules)
    matchers: list[GrammarMatcher | None] = [serials.bind(grammar) for _ in range(5)]
    _rows(table, matchers)
    assert table.num_builds == 1 and len(table) == 1
    assert matchers[0] is not None and matchers[0].accept_token(11)  # one request moves on
    got = _rows(table, matchers)
    assert table.num_builds == 2 and len(table) == 2
    for _ in range(3):  # nothing new: lookups only
        got = _rows(table, matchers)
    assert table.num_builds == 2
    for i, matcher in enumerate(matchers):
        assert torch.equal(got[i], _expected(rules, matcher))


def test_the_same_state_number_in_two_grammars_gets_two_rows() -> None:
    """State 0 of two grammars: different masks, so never one row for both."""
    rules = EosRules([EOS])
    serials = GrammarSerials()
    first, second = _chain(VOCAB, 3, 10), _chain(VOCAB, 3, 20)
    table = _table(rules)
    a, b = serials.bind(first), serials.bind(second)
    assert a.inner.state_key() == b.inner.state_key()  # the backend's keys collide
    assert a.state_key() != b.state_key()
    for _ in range(2):
        got = _rows(table, [a, b])
        assert torch.equal(got[0], _expected(rules, a)) and torch.equal(got[1], _expected(rules, b))
    assert table.num_builds == 2


def test_a_grammar_compiled_again_gets_a_new_serial() -> None:
    """A grammar object that died (evicted from the compile cache) takes its serial with
    it: a new object, even at the same address, never finds the old rows."""
    serials = GrammarSerials()
    old = _chain(VOCAB, 3, 10)
    old_serial = serials.serial(old)
    assert serials.serial(old) == old_serial and len(serials) == 1
    del old
    gc.collect()
    assert len(serials) == 0
    assert serials.serial(_chain(VOCAB, 3, 20)) != old_serial


def test_matchers_without_a_key_are_built_every_step() -> None:
    rules = EosRules([EOS])
    table = _table(rules)
    unbound = FixedMatcher(VOCAB, [1])  # the manager did not bind it: no key
    keyless = BoundMatcher(FixedMatcher(VOCAB, [2]), grammar_serial=7)  # backend: no key
    assert keyless.state_key() is None
    first = _rows(table, [unbound, keyless])
    unbound.mask = torch.zeros(VOCAB, dtype=torch.bool)
    unbound.mask[4] = True  # the same object, another mask
    second = _rows(table, [unbound, keyless])
    assert first[0].nonzero().flatten().tolist() == [1]
    assert second[0].nonzero().flatten().tolist() == [4]
    assert second[1].nonzero().flatten().tolist() == [2]
    assert table.num_builds == 4


def test_least_recently_used_rows_are_reused_but_never_within_a_step() -> None:
    rules = EosRules([EOS])
    serials = GrammarSerials()
    grammar = _chain(VOCAB, 8, 0)
    table = _table(rules, max_rows=4)  # 3 rows for states, plus the unconstrained row

    def at(state: int) -> GrammarMatcher:
        matcher = serials.bind(grammar)
        for token in range(1, state + 1):
            assert matcher.accept_token(token)
        return matcher

    # One step with 5 distinct states: more than the table holds, so it grows.
    step = [at(s) for s in range(5)]
    got = _rows(table, list(step))
    assert table.capacity >= 6
    for i, matcher in enumerate(step):
        assert torch.equal(got[i], _expected(rules, matcher))
    # Later steps: capacity stays, old states are evicted and rebuilt, rows stay exact.
    capacity = table.capacity
    for states in ([5, 6, 7], [0, 1], [5, 0, 7, 6], [2, 3, 4, 5, 6, 7], [1]):
        matchers = [at(s) for s in states]
        got = _rows(table, list(matchers))
        for i, matcher in enumerate(matchers):
            assert torch.equal(got[i], _expected(rules, matcher)), (states, i)
    assert table.capacity == capacity
    builds = table.num_builds
    _rows(table, [at(1)])  # the most recent state: still there
    assert table.num_builds == builds


def test_sampler_applies_packed_rows_like_bool_rows() -> None:
    rules = EosRules([3])
    serials = GrammarSerials()
    table = _table(rules)
    matchers: list[GrammarMatcher | None] = [
        FixedMatcher(VOCAB, [0, 4, 8]),
        None,
        FixedMatcher(VOCAB, [36]),
        serials.bind(_chain(VOCAB, 3, 10)),
    ]
    logits = torch.randn(len(matchers), VOCAB, device=DEVICE)
    packed_masks = table.lookup(matchers)
    bool_masks = [None if m is None else rules.widen(m, VOCAB) for m in matchers]
    packed = apply_allowed_token_masks(logits.clone(), packed_masks)
    plain = apply_allowed_token_masks(logits.clone(), bool_masks)
    assert torch.equal(packed, plain) and packed.device.type == DEVICE.type
    assert torch.isinf(packed[0]).sum() == VOCAB - 3 and not torch.isinf(packed[1]).any()
    raw = logits.clone()
    copy = apply_packed_masks(logits, packed_masks, in_place=False)
    assert torch.equal(copy, plain) and torch.equal(logits, raw)  # the input untouched
    # The whole sampler, greedy: the same tokens either way, each one allowed; with a
    # bias (the masks then apply to the sampler's working copy, in place) too.
    for bias in (None, {36: -50.0, 8: 100.0}):
        params = [SamplingParams(temperature=0.0, logit_bias=bias) for _ in matchers]
        batches = [
            SamplingBatch(params, [None] * 4, [[]] * 4, [[]] * 4, allowed_token_masks=masks)
            for masks in (packed_masks, bool_masks)
        ]
        tokens = [Sampler()(logits, batch).token_ids for batch in batches]
        assert tokens[0] == tokens[1]
        assert tokens[0][0] in (0, 4, 8) and tokens[0][2] == 36
        assert bias is None or tokens[0][0] == 8
    assert torch.equal(logits, raw)


def test_packed_masks_for_other_logits_are_refused() -> None:
    table = _table(EosRules([EOS]))
    masks = table.lookup([FixedMatcher(VOCAB, [1])])
    with pytest.raises(ValueError, match="packed masks for 1 rows of 37 tokens"):
        apply_packed_masks(torch.zeros(2, VOCAB, device=DEVICE), masks)
