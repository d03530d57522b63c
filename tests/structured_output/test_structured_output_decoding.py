"""Constrained decoding of a gibberish model: random logits, the real sampler, the masks.

Each step draws random logits over the model's (padded) vocabulary, builds the batch's
masks with ``StructuredOutputManager.batch_masks``, samples with ``Sampler`` and feeds
the tokens back with ``accept_token``, until each row samples an EOS id. Every finished
output must satisfy its constraint; unconstrained rows in the same batch stay free.
"""

from __future__ import annotations

import json
import re
from typing import Any

import jsonschema
import pytest
import torch
from engine.errors import RequestValidationError
from engine.model_executor.sampler import Sampler, SamplingBatch
from engine.sampling_params import SamplingParams
from engine.sampling_params import StructuredOutputsParams as Params
from structured_output_fakes import FixedMatcher, ManagerFactory

PADDING = 24  # model vocabulary rows past the tokenizer (never allowed by a grammar)
MAX_STEPS = 300

SCHEMA = {
    "type": "object",
    "properties": {
        "id": {"type": "integer"},
        "label": {"type": "string", "maxLength": 6},
        "ok": {"type": "boolean"},
        "color": {"enum": ["red", "green", "blue"]},
    },
    "required": ["id", "ok", "color"],
    "additionalProperties": False,
}
REGEX = r"(\+|-)?[0-9]{1,4}(\.[0-9]{2})? (EUR|USD)"
CHOICES = ["alpha", "beta gamma", "δέλτα", "{x}"]


@pytest.fixture
def eos_ids(tiny_tokenizer: Any) -> list[int]:
    """The tokenizer's EOS and the chat end marker, as a generation config lists them."""
    return [tiny_tokenizer.eos_token_id, tiny_tokenizer.convert_tokens_to_ids("<|im_end|>")]


def decode_batch(
    manager: Any,
    constraints: list[Params | None],
    eos_ids: list[int],
    seed: int,
    temperature: float = 1.0,
) -> list[tuple[list[int], bool]]:
    """Run the loop for one batch; per row the output ids and whether it ended with EOS."""
    torch.manual_seed(seed)
    vocab_size = manager.vocab_size
    matchers = [None if c is None else manager.matcher_for(c) for c in constraints]
    params = [SamplingParams(temperature=temperature, max_tokens=MAX_STEPS) for _ in constraints]
    outputs: list[list[int]] = [[] for _ in constraints]
    ended = [False] * len(constraints)
    sampler = Sampler()
    for _ in range(MAX_STEPS):
        rows = [i for i in range(len(constraints)) if not ended[i]]
        if not rows:
            break
        masks = manager.batch_masks([matchers[i] for i in rows], vocab_size)
        batch = SamplingBatch(
            params=[params[i] for i in rows],
            generators=[None] * len(rows),
            prompt_token_ids=[[1, 2, 3]] * len(rows),
            output_token_ids=[outputs[i] for i in rows],
            allowed_token_masks=masks,
        )
        logits = torch.randn(len(rows), vocab_size) * 4
        sampled = sampler(logits, batch).token_ids
        for row, token_id in zip(rows, sampled, strict=True):
            matcher = matchers[row]
            if matcher is not None:
                assert manager.accept_token(matcher, token_id), (row, token_id)
            if token_id in eos_ids:
                ended[row] = True
            else:
                outputs[row].append(token_id)
    return list(zip(outputs, ended, strict=True))


def test_random_logits_satisfy_every_constraint(
    make_manager: ManagerFactory, tiny_tokenizer: Any, eos_ids: list[int]
) -> None:
    num_tokenizer = len(tiny_tokenizer)
    manager = make_manager(vocab_size=num_tokenizer + PADDING, eos_token_ids=eos_ids)
    constraints = [Params(json=SCHEMA), Params(regex=REGEX), Params(choice=CHOICES), None]
    num_ended = [0, 0, 0]
    free_tokens: list[int] = []
    for seed in range(8):
        results = decode_batch(manager, constraints, eos_ids, seed)
        for row, (token_ids, ended) in enumerate(results[:3]):
            assert all(t < num_tokenizer for t in token_ids), "a padded id was sampled"
            if not ended:
                continue
            num_ended[row] += 1
            text = tiny_tokenizer.decode(token_ids)
            if row == 0:
                jsonschema.validate(json.loads(text), SCHEMA)
            elif row == 1:
                assert re.fullmatch(REGEX, text), text
            else:
                assert text in CHOICES, text
        free_tokens += results[3][0]
    assert num_ended[1] == num_ended[2] == 8, num_ended
    assert num_ended[0] >= 4, num_ended
    # The unconstrained row really was free: it wandered into the padded ids.
    assert any(t >= num_tokenizer for t in free_tokens)


def test_greedy_rows_pick_the_best_allowed_token(
    make_manager: ManagerFactory, eos_ids: list[int], tiny_tokenizer: Any
) -> None:
    manager = make_manager(eos_token_ids=eos_ids)
    for seed in range(3):
        ((token_ids, ended),) = decode_batch(manager, [Params(choice=CHOICES)], eos_ids, seed, 0.0)
        assert ended and tiny_tokenizer.decode(token_ids) in CHOICES


def test_every_eos_id_is_allowed_where_the_grammar_may_end(
    make_manager: ManagerFactory, tiny_tokenizer: Any, eos_ids: list[int]
) -> None:
    manager = make_manager(eos_token_ids=eos_ids)
    matcher = manager.matcher_for(Params(regex="[0-9]+"))
    (mask,) = manager.batch_masks([matcher])
    assert not mask[eos_ids].any(), "the empty output does not match [0-9]+"
    assert not manager.accept_token(matcher, eos_ids[1])
    assert manager.accept_token(matcher, tiny_tokenizer.convert_tokens_to_ids("7"))
    (mask,) = manager.batch_masks([matcher])
    assert mask[eos_ids].all() and mask.sum() > len(eos_ids)  # may end, may go on
    assert manager.accept_token(matcher, eos_ids[1])  # the generation config's EOS


def test_terminated_matcher_allows_only_eos(
    make_manager: ManagerFactory, tiny_tokenizer: Any, eos_ids: list[int]
) -> None:
    manager = make_manager(vocab_size=len(tiny_tokenizer) + PADDING, eos_token_ids=eos_ids)
    text_ids = tiny_tokenizer.encode("beta gamma", add_special_tokens=False)
    matcher = manager.matcher_for(Params(choice=CHOICES), text_ids)
    assert matcher.is_terminated()
    (mask,) = manager.batch_masks([matcher])
    assert mask.shape == (len(tiny_tokenizer) + PADDING,)
    assert mask.nonzero().flatten().tolist() == sorted(eos_ids)


def test_matcher_for_replays_and_rejects(make_manager: ManagerFactory, tiny_tokenizer: Any) -> None:
    manager = make_manager()
    ids = tiny_tokenizer.encode("12", add_special_tokens=False)
    matcher = manager.matcher_for(Params(regex="[0-9]{2}x"), ids)
    x_id = tiny_tokenizer.convert_tokens_to_ids("x")
    assert manager.batch_masks([matcher])[0].nonzero().flatten().tolist() == [x_id]
    bad = tiny_tokenizer.encode("1a", add_special_tokens=False)
    with pytest.raises(RequestValidationError, match="does not fit the constraint"):
        manager.matcher_for(Params(regex="[0-9]{2}x"), bad)


def test_masks_resized_and_dead_ends_end_the_output(
    make_manager: ManagerFactory, eos_ids: list[int]
) -> None:
    manager = make_manager(eos_token_ids=eos_ids)
    short = FixedMatcher(10, [4, 5])
    dead = FixedMatcher(manager.vocab_size, [])
    done = FixedMatcher(manager.vocab_size, [4], terminated=True)
    masks = manager.batch_masks([short, None, dead, done], vocab_size=manager.vocab_size + 8)
    assert masks[0] is not None and masks[0].shape == (manager.vocab_size + 8,)
    assert masks[0].nonzero().flatten().tolist() == [4, 5]
    assert masks[1] is None
    for mask in masks[2:]:
        assert mask is not None and mask.nonzero().flatten().tolist() == sorted(eos_ids)
    assert manager.accept_token(dead, eos_ids[0])


def test_masks_move_to_the_requested_device(make_manager: ManagerFactory) -> None:
    manager = make_manager()
    matcher = manager.matcher_for(Params(regex="a+"))
    (mask,) = manager.batch_masks([matcher], device="meta")
    assert mask is not None and mask.device.type == "meta" and mask.dtype == torch.bool
