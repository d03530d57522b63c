"""Synthetic benchmark workloads: random token prompts with fixed or ranged lengths."""

from __future__ import annotations

import random
from dataclasses import dataclass


@dataclass
class BenchRequest:
    prompt_token_ids: list[int]
    output_len: int


def _length(base: int, range_ratio: float, rng: random.Random) -> int:
    low = max(1, int(base * (1 - range_ratio)))
    high = max(low, int(base * (1 + range_ratio)))
    return rng.randint(low, high)


def random_requests(
    num_prompts: int,
    input_len: int,
    output_len: int,
    vocab_size: int,
    range_ratio: float = 0.0,
    prefix_len: int = 0,
    seed: int = 0,
) -> list[BenchRequest]:
    """Prompts of random token ids; ``prefix_len`` tokens shared by all prompts in front."""
    if not 0 <= range_ratio < 1:
        raise ValueError(f"--random-range-ratio must be in [0, 1), got {range_ratio}")
    rng = random.Random(seed)
    # Stay clear of the top of the vocabulary, where special tokens usually sit.
    high = max(2, min(vocab_size - 1, vocab_size - 256))
    prefix = [rng.randrange(high) for _ in range(prefix_len)]
    out = []
    for _ in range(num_prompts):
        n_in = _length(input_len, range_ratio, rng)
        n_out = _length(output_len, range_ratio, rng)
        out.append(BenchRequest(prefix + [rng.randrange(high) for _ in range(n_in)], n_out))
    return out


def nano_vllm_requests(
    num_seqs: int = 256, max_input_len: int = 1024, max_output_len: int = 1024
) -> list[BenchRequest]:
    """nano-vllm's published bench: lengths uniform in 100..max, token ids below 10,000.

    Drawn in the same order as that script with ``random.seed(0)``: every prompt first,
    then every output length.
    """
    rng = random.Random(0)
    prompts = [
        [rng.randint(0, 10000) for _ in range(rng.randint(100, max_input_len))]
        for _ in range(num_seqs)
    ]
    outputs = [rng.randint(100, max_output_len) for _ in range(num_seqs)]
    return [BenchRequest(p, o) for p, o in zip(prompts, outputs, strict=True)]
