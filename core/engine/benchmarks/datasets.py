"""Benchmark workloads: random token prompts with fixed or ranged lengths, nano-vllm's
draw, and a JSONL file of requests (vLLM's custom-dataset format)."""

from __future__ import annotations

import json
import random
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path


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


def custom_requests(
    path: str | Path,
    encode: Callable[[str], list[int]],
    num_prompts: int | None = None,
    output_len: int | None = None,
) -> list[BenchRequest]:
    """Requests from a JSONL file, one a line, in vLLM's custom-dataset format:
    ``{"prompt": TEXT, "output_tokens": N}`` (the text through ``encode``, as a text
    prompt goes to ``LLM.generate``; no chat template, as ``vllm bench
    --skip-chat-template``), or ``"prompt_token_ids": [...]`` instead of ``"prompt"``.
    The first ``num_prompts`` lines (all if None; no oversampling); ``output_len`` > 0
    replaces every line's ``output_tokens`` (``--custom-output-len``). Errors name the
    file and line."""
    requests: list[BenchRequest] = []
    for number, raw in enumerate(Path(path).read_text().splitlines(), 1):
        if num_prompts is not None and len(requests) >= num_prompts:
            break
        if not raw.strip():
            continue
        where = f"{path}, line {number}"
        try:
            item = json.loads(raw)
        except json.JSONDecodeError as exc:
            raise ValueError(f"{where}: not JSON ({exc.msg})") from None
        if not isinstance(item, dict):
            raise ValueError(f"{where}: expected an object with 'prompt' and 'output_tokens'")
        if isinstance(item.get("prompt_token_ids"), list):
            ids = [int(t) for t in item["prompt_token_ids"]]
        elif isinstance(item.get("prompt"), str):
            ids = list(encode(item["prompt"]))
        else:
            raise ValueError(f"{where}: needs a 'prompt' string or a 'prompt_token_ids' list")
        if not ids:
            raise ValueError(f"{where}: the prompt has no tokens")
        n_out = (
            output_len if output_len is not None and output_len > 0 else item.get("output_tokens")
        )
        if isinstance(n_out, bool) or not isinstance(n_out, int) or n_out < 1:
            raise ValueError(
                f"{where}: 'output_tokens' must be a positive integer, got {n_out!r} "
                "(or set every request's with --custom-output-len)"
            )
        requests.append(BenchRequest(ids, n_out))
    if not requests:
        raise ValueError(f"{path}: no requests")
    return requests
