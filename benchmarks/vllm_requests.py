"""Write the requests `vllm bench throughput --dataset-name random` runs as a JSONL file
that `engine bench throughput --dataset-name custom --dataset-path F` reads, so that both
engines run one request list (W4's two draws differed: 11% more output tokens in vLLM's).

Runs in vLLM's environment on the GPU machine (``../shared/vllm-anchor``), with the same
model folder, seed and length arguments as the vLLM run::

    (source $HOME/v/env.sh; python3 benchmarks/vllm_requests.py --model $VLLM_MODEL \\
        --num-prompts 256 --random-input-len 562 --random-output-len 562 \\
        --random-range-ratio 0.822 --out /tmp/w4_requests.jsonl)

One line a request: ``{"prompt": TEXT, "output_tokens": N}`` (vLLM's custom-dataset
format) or ``{"prompt_token_ids": [...], "output_tokens": N}`` where vLLM's sample holds
token ids. Prints the totals, to check against vLLM's "Total num prompt tokens" line.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any


def _line(sample: Any) -> dict[str, Any]:
    prompt = sample.prompt
    if isinstance(prompt, dict):  # a TokensPrompt / TextPrompt
        prompt = prompt.get("prompt_token_ids", prompt.get("prompt"))
    key = "prompt" if isinstance(prompt, str) else "prompt_token_ids"
    value = prompt if isinstance(prompt, str) else [int(t) for t in prompt]
    return {key: value, "output_tokens": int(sample.expected_output_len)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", required=True)
    parser.add_argument("--num-prompts", type=int, required=True)
    parser.add_argument("--random-input-len", type=int, required=True)
    parser.add_argument("--random-output-len", type=int, required=True)
    parser.add_argument("--random-range-ratio", type=float, default=0.0)
    parser.add_argument("--seed", type=int, default=0)  # vllm bench's default
    parser.add_argument("--out", type=Path, required=True)
    args = parser.parse_args()

    from transformers import AutoTokenizer
    from vllm.benchmarks.datasets import RandomDataset

    tokenizer = AutoTokenizer.from_pretrained(args.model)
    samples = RandomDataset(random_seed=args.seed).sample(
        tokenizer=tokenizer,
        num_requests=args.num_prompts,
        input_len=args.random_input_len,
        output_len=args.random_output_len,
        range_ratio=args.random_range_ratio,
    )
    lines = [_line(s) for s in samples]
    args.out.write_text("".join(json.dumps(line) + "\n" for line in lines))
    prompt_tokens = sum(int(s.prompt_len) for s in samples)
    output_tokens = sum(line["output_tokens"] for line in lines)
    print(f"{len(lines)} requests, {prompt_tokens} prompt tokens (vLLM's count), "
          f"{output_tokens} output tokens -> {args.out}")  # fmt: skip


if __name__ == "__main__":
    main()
