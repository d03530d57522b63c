"""OutlinesBackend: random walks through the masks produce only matching outputs.

A "gibberish model" picks a uniformly random allowed token at every step until EOS; if
the masks ever allowed a wrong token, some walk would produce an output that fails the
check (schema validation, full regex match, membership in the choices).
"""

from __future__ import annotations

import json
import random
import re
from typing import Any

import engine_outlines.plugin
import jsonschema
import pytest
import torch
from engine_outlines.backend import OutlinesBackend
from engine_outlines.grammar import OutlinesGrammar
from engine_outlines.regexes import escape_literal
from engine_sdk.testing import PluginConformance
from engine_sdk.testing.structured_output import assert_matcher_conforms, unpack_bitmask

NUM_WALKS = 12
MAX_STEPS = 400


class TestOutlinesPluginConformance(PluginConformance):
    plugin = engine_outlines.plugin
    expected = {"structured_output_backend": ["outlines"]}


@pytest.fixture(scope="module")
def backend(tiny_tokenizer: Any) -> OutlinesBackend:
    # A model vocabulary padded past the tokenizer, as real checkpoints often are.
    return OutlinesBackend(tiny_tokenizer, len(tiny_tokenizer) + 24)


def walk(backend: OutlinesBackend, grammar: OutlinesGrammar, seed: int) -> tuple[str, bool]:
    """Random allowed tokens until EOS; the decoded text and whether EOS was reached."""
    rng = random.Random(seed)
    matcher = grammar.new_matcher()
    token_ids: list[int] = []
    for _ in range(MAX_STEPS):
        mask = matcher.allowed_token_ids()
        assert mask.dtype == torch.bool and mask.shape == (backend.vocab_size,)
        assert not mask[len(backend.tokenizer) :].any(), "ids past the tokenizer allowed"
        allowed = mask.nonzero().flatten().tolist()
        assert allowed, "a state with no allowed token"
        token_id = rng.choice(allowed)
        assert matcher.accept_token(token_id)
        if token_id == backend.eos_token_id:
            assert matcher.is_terminated()
            return _decode(backend, token_ids), True
        token_ids.append(token_id)
    return _decode(backend, token_ids), False


def _decode(backend: OutlinesBackend, token_ids: list[int]) -> str:
    text: str = backend.tokenizer.decode(token_ids)
    return text


@pytest.mark.parametrize(
    "pattern",
    [r"\d{3}-[a-z]{2,5}", r"(cat|dog|bird)s?( and (cat|dog))?", r"[A-Z][a-z]* ?[0-9]{0,3}"],
)
def test_regex_walks_match_in_full(backend: OutlinesBackend, pattern: str) -> None:
    grammar = backend.compile("regex", pattern)
    for seed in range(NUM_WALKS):
        text, ended = walk(backend, grammar, seed)
        assert ended
        assert re.fullmatch(pattern, text), (pattern, text)


def test_choice_walks_give_a_choice(backend: OutlinesBackend) -> None:
    choices = ["yes", "no", "ça va?", "a|b (c)", "[x]*", "yes please"]
    grammar = backend.compile("choice", choices)
    seen = set()
    for seed in range(40):
        text, ended = walk(backend, grammar, seed)
        assert ended and text in choices, text
        seen.add(text)
    assert len(seen) >= 4, seen


SCHEMA = {
    "type": "object",
    "properties": {
        "name": {"type": "string", "maxLength": 12},
        "age": {"type": "integer"},
        "kind": {"enum": ["cat", "dog"]},
        "tags": {"type": "array", "items": {"type": "boolean"}, "maxItems": 3},
        "score": {"type": ["number", "null"]},
    },
    "required": ["name", "age", "kind"],
    "additionalProperties": False,
}


def test_json_schema_walks_validate(backend: OutlinesBackend) -> None:
    grammar = backend.compile("json", SCHEMA)
    num_ended = 0
    for seed in range(NUM_WALKS):
        text, ended = walk(backend, grammar, seed)
        if not ended:
            continue  # a long string value; the prefix property is checked below
        num_ended += 1
        jsonschema.validate(json.loads(text), SCHEMA)
    assert num_ended >= NUM_WALKS // 2


def test_json_schema_as_string(backend: OutlinesBackend) -> None:
    grammar = backend.compile("json", json.dumps({"type": "array", "items": {"type": "integer"}}))
    text, ended = walk(backend, grammar, 3)
    assert ended and all(isinstance(v, int) for v in json.loads(text))


def test_json_object_walks_parse_to_objects(backend: OutlinesBackend) -> None:
    grammar = backend.compile("json_object", True)
    num_ended = 0
    for seed in range(NUM_WALKS):
        text, ended = walk(backend, grammar, seed)
        if ended:
            num_ended += 1
            assert isinstance(json.loads(text), dict), text
    assert num_ended >= 1


@pytest.mark.parametrize(
    ("schema", "kind"), [({"type": "object"}, dict), ({"type": "array"}, list)]
)
def test_free_form_schema_is_bounded(backend: OutlinesBackend, schema: Any, kind: type) -> None:
    grammar = backend.compile("json", schema)
    num_ended = 0
    for seed in range(NUM_WALKS):
        text, ended = walk(backend, grammar, seed)
        if ended:
            num_ended += 1
            assert isinstance(json.loads(text), kind), text
    assert num_ended >= 1
    # Depth 2: a value may be an array of scalars, but not an array of arrays.
    deep = '{"a": [[1]]}' if kind is dict else "[[[1]]]"
    assert not _rust_fullmatch(grammar.regex, deep)
    shallow = '{"a": [1, "x"], "b": {"c": null}}' if kind is dict else '[[1], {"a": true}, 2]'
    assert _rust_fullmatch(grammar.regex, shallow)


def test_terminated_allows_only_eos(backend: OutlinesBackend) -> None:
    grammar = backend.compile("choice", ["ok"])
    matcher = grammar.new_matcher()
    ok_ids = backend.tokenizer.encode("ok", add_special_tokens=False)
    assert not matcher.is_terminated()
    for token_id in ok_ids:
        assert matcher.accept_token(token_id)
    assert matcher.is_terminated()
    assert matcher.allowed_token_ids().nonzero().flatten().tolist() == [backend.eos_token_id]
    assert not matcher.accept_token(ok_ids[0])
    assert matcher.accept_token(backend.eos_token_id)
    assert not matcher.accept_token(backend.eos_token_id)  # nothing after the end


def test_final_state_that_can_continue_allows_eos_and_more(backend: OutlinesBackend) -> None:
    grammar = backend.compile("regex", "[0-9]+")
    matcher = grammar.new_matcher()
    assert not matcher.allowed_token_ids()[backend.eos_token_id]  # empty is not a match
    assert matcher.accept_token(backend.tokenizer.convert_tokens_to_ids("4"))
    mask = matcher.allowed_token_ids()
    assert mask[backend.eos_token_id] and mask.sum() > 1
    assert not matcher.is_terminated()


def test_rejects_disallowed_and_out_of_range_tokens(backend: OutlinesBackend) -> None:
    matcher = backend.compile("regex", "[0-9]+").new_matcher()
    assert not matcher.accept_token(backend.tokenizer.convert_tokens_to_ids("a"))
    assert not matcher.accept_token(backend.vocab_size + 5)
    assert not matcher.accept_token(-1)


def test_masks_are_cached_per_state(backend: OutlinesBackend) -> None:
    grammar = backend.compile("regex", "a[0-9]+")
    first, second = grammar.new_matcher(), grammar.new_matcher()
    assert first.allowed_token_ids() is second.allowed_token_ids()
    assert grammar.num_cached_states() == 1
    assert grammar.num_bytes > 0


@pytest.mark.parametrize(
    ("kind", "spec", "reason"),
    [
        ("json", {"type": "foo"}, "invalid JSON schema at type"),
        ("json", "{not json", "not valid JSON"),
        ("json", [1, 2], "must be an object"),
        ("regex", "(unclosed", "cannot compile the regex"),
        ("regex", "(?<=a)b", "look-around"),
        ("regex", 5, "regex must be a string"),
        ("choice", [], "non-empty list"),
        ("choice", ["a", 3], "must be a string"),
        ("grammar", 'root ::= "a"', "grammar is not supported by this server"),
        ("xml", "<a/>", "unknown structured output kind"),
    ],
)
def test_bad_input_names_the_problem(
    backend: OutlinesBackend, kind: str, spec: Any, reason: str
) -> None:
    with pytest.raises(ValueError, match=re.escape(reason)):
        backend.compile(kind, spec)


def _rust_fullmatch(pattern: str, text: str) -> bool:
    """Whether outlines-core (Rust regex) matches ``text`` in full, byte by byte."""
    from outlines_core import Index, Vocabulary

    vocabulary = Vocabulary(256, {bytes([b]): [b] for b in range(256)})
    index = Index(pattern, vocabulary)
    state = index.get_initial_state()
    for byte in text.encode("utf-8"):
        state = index.get_next_state(state, byte)
        if state is None:
            return False
    return bool(index.is_final_state(state))


def test_escape_literal_matches_itself_only() -> None:
    texts = ["a.b", "x*y+z?", "(a|b)", "[]{}^$\\", "tab\there\nnew", "ünï 東 😀", '- # & ~ "']
    for text in texts:
        pattern = escape_literal(text)
        assert _rust_fullmatch(pattern, text), (text, pattern)
        assert not _rust_fullmatch(pattern, text + "x")
        assert not _rust_fullmatch(pattern, text[:-1])


def test_qwen3_json_schema(qwen3_tokenizer: Any) -> None:
    """The real 151k-token vocabulary: a small schema compiles and walks validate."""
    backend = OutlinesBackend(qwen3_tokenizer, 151936)
    schema = {
        "type": "object",
        "properties": {"city": {"type": "string", "maxLength": 8}, "n": {"type": "integer"}},
        "required": ["city", "n"],
    }
    grammar = backend.compile("json", schema)
    for seed in range(3):
        text, ended = walk(backend, grammar, seed)
        if ended:
            jsonschema.validate(json.loads(text), schema)


# -- the optional matcher methods the engine's mask table uses -------------------------------


@pytest.mark.parametrize(
    ("kind", "spec"),
    [
        ("json", SCHEMA),
        ("regex", r"(\+|-)?[0-9]{1,4}(\.[0-9]{2})?"),
        ("choice", ["ok", "okay", "no"]),
    ],
)
def test_matchers_conform(backend: OutlinesBackend, kind: str, spec: Any) -> None:
    """``state_key`` names one mask, ``fill_bitmask`` writes the bool mask, forbidden ids
    are refused (``engine_sdk.testing.structured_output``)."""
    grammar = backend.compile(kind, spec)
    report = assert_matcher_conforms(
        grammar, backend.vocab_size, eos_token_id=backend.eos_token_id, num_walks=10
    )
    assert report.num_keyed_steps == report.num_steps  # every state has a key
    assert report.num_filled_steps > 0
    assert len(report.keys) < report.num_steps  # walks meet states again: keys repeat


def test_accept_token_refuses_exactly_what_the_mask_forbids(backend: OutlinesBackend) -> None:
    """Every id, at every state of a few walks: accepted iff the mask allows it (the
    matcher advances outlines-core without looking at the mask)."""
    grammar = backend.compile("json", SCHEMA)
    rng = random.Random(3)
    for _ in range(3):
        prefix: list[int] = []
        for _ in range(40):
            matcher = grammar.new_matcher()
            for token_id in prefix:
                assert matcher.accept_token(token_id)
            mask = matcher.allowed_token_ids()
            for token_id in range(-1, backend.vocab_size + 2):
                probe = grammar.new_matcher()
                for earlier in prefix:
                    probe.accept_token(earlier)
                allowed = 0 <= token_id < backend.vocab_size and bool(mask[token_id])
                assert probe.accept_token(token_id) == allowed, (prefix, token_id)
            choices = [t for t in mask.nonzero().flatten().tolist() if t != backend.eos_token_id]
            if not choices:
                break
            prefix.append(rng.choice(choices))


def test_terminated_and_ended_matchers_have_their_own_keys(backend: OutlinesBackend) -> None:
    grammar = backend.compile("choice", ["ok"])
    matcher = grammar.new_matcher()
    for token_id in backend.tokenizer.encode("ok", add_special_tokens=False):
        assert matcher.accept_token(token_id)
    assert matcher.is_terminated()
    before = matcher.state_key()
    assert matcher.accept_token(backend.eos_token_id)
    assert matcher.state_key() == -1 != before
    words = torch.zeros(-(-backend.vocab_size // 32), dtype=torch.int32)
    assert matcher.fill_bitmask(words)
    assert unpack_bitmask(words, backend.vocab_size).nonzero().flatten().tolist() == [
        backend.eos_token_id
    ]
