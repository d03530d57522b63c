"""``logit_bias`` in the sampler on CPU: exact additions, and how it combines with
penalties, ``min_tokens``, stop token ids and structured-output masks."""

from __future__ import annotations

import pytest
import torch
from engine.model_executor.logit_masks import apply_logit_bias
from engine.model_executor.sampler import Sampler, SamplingBatch
from engine.sampling_params import SamplingParams

VOCAB_SIZE = 50


def _batch(
    params: list[SamplingParams],
    outputs: list[list[int]] | None = None,
    masks: list[torch.Tensor | None] | None = None,
) -> SamplingBatch:
    n = len(params)
    return SamplingBatch(
        params=params,
        generators=[None] * n,
        prompt_token_ids=[[1, 2, 3]] * n,
        output_token_ids=outputs if outputs is not None else [[]] * n,
        allowed_token_masks=masks,
    )


def test_bias_is_added_per_row_and_ids_past_the_logits_are_skipped() -> None:
    logits = torch.zeros(3, VOCAB_SIZE)
    params = [
        SamplingParams(logit_bias={4: 2.5, 7: -100.0}),
        SamplingParams(),
        SamplingParams(logit_bias={0: 100.0, VOCAB_SIZE + 3: 5.0}),
    ]
    apply_logit_bias(logits, params)
    expected = torch.zeros(3, VOCAB_SIZE)
    expected[0, 4], expected[0, 7], expected[2, 0] = 2.5, -100.0, 100.0
    assert torch.equal(logits, expected)


def test_greedy_and_random_rows_follow_the_bias() -> None:
    logits = torch.zeros(2, VOCAB_SIZE)
    logits[:, 5] = 10.0
    params = [
        SamplingParams(temperature=0.0, logit_bias={5: -100.0, 9: 1.0}),
        SamplingParams(temperature=1.0, logit_bias={11: 100.0}),
    ]
    out = Sampler()(logits, _batch(params))
    assert out.token_ids == [9, 11]


def test_bias_never_overrides_min_tokens_stop_ids_or_allowed_masks() -> None:
    logits = torch.zeros(3, VOCAB_SIZE)
    mask = torch.zeros(VOCAB_SIZE, dtype=torch.bool)
    mask[20] = mask[21] = True
    params = [
        # EOS pushed up, but min_tokens still forbids it (ignore_eos or not)
        SamplingParams(temperature=0.0, min_tokens=4, eos_token_ids=[7], logit_bias={7: 100.0}),
        SamplingParams(
            temperature=0.0,
            min_tokens=4,
            eos_token_ids=[7],
            ignore_eos=True,
            stop_token_ids=[8],
            logit_bias={7: 100.0, 8: 100.0, 3: 1.0},
        ),  # fmt: skip
        # a structured-output mask wins over any bias
        SamplingParams(temperature=0.0, logit_bias={5: 100.0, 21: 3.0}),
    ]
    out = Sampler()(logits, _batch(params, outputs=[[1], [1], [1]], masks=[None, None, mask]))
    assert out.token_ids[1] == 3 and out.token_ids[2] == 21
    assert out.token_ids[0] not in (7, 8)
    # Once min_tokens is reached the biased EOS is chosen.
    done = Sampler()(logits[:1].clone(), _batch(params[:1], outputs=[[1, 1, 1, 1]]))
    assert done.token_ids == [7]


def test_bias_applies_before_penalties() -> None:
    # Row 0: two tokens biased equally; the frequency penalty then separates them.
    # Row 1: the repetition penalty scales the biased logit, as in vLLM (bias first).
    logits = torch.zeros(2, VOCAB_SIZE)
    params = [
        SamplingParams(temperature=0.0, logit_bias={3: 50.0, 4: 50.0}, frequency_penalty=1.0),
        SamplingParams(temperature=0.0, logit_bias={3: 10.0, 4: 8.0}, repetition_penalty=2.0),
    ]
    out = Sampler()(logits, _batch(params, outputs=[[3, 3], [3]]))
    # Row 0: 50 - 2 < 50. Row 1: (0 + 10) / 2 = 5 < 8 (bias after the penalty: 10 > 8).
    assert out.token_ids == [4, 4]


def test_validate_rejects_out_of_range_bias() -> None:
    with pytest.raises(ValueError, match="logit_bias"):
        SamplingParams(logit_bias={1: 101.0}).validate()
    with pytest.raises(ValueError, match="logit_bias"):
        SamplingParams(logit_bias={-1: 1.0}).validate()
    with pytest.raises(ValueError, match="logit_bias"):
        SamplingParams(logit_bias={1: float("nan")}).validate()
