"""Hugging Face transformers ``generate`` on the same random model: the baseline figures.

Batch 1 (input 128, 64 new tokens): ms per step. Batch 256 (input 512, output 256):
output tokens per second. Writes hf.json under --out.
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

import torch
from transformers import AutoConfig, AutoModelForCausalLM


def _time_generate(model: torch.nn.Module, batch: int, in_len: int, out_len: int) -> float:
    ids = torch.randint(0, 10000, (batch, in_len), device="cuda")
    mask = torch.ones_like(ids)
    kwargs = dict(max_new_tokens=out_len, min_new_tokens=out_len, do_sample=False, pad_token_id=0)
    model.generate(
        ids[:, :16], attention_mask=mask[:, :16], max_new_tokens=4, do_sample=False, pad_token_id=0
    )
    torch.cuda.synchronize()
    start = time.perf_counter()
    model.generate(ids, attention_mask=mask, **kwargs)
    torch.cuda.synchronize()
    return time.perf_counter() - start


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--model", required=True)
    parser.add_argument("--out", type=Path, required=True)
    args = parser.parse_args()
    config = AutoConfig.from_pretrained(args.model)
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(config, torch_dtype=torch.bfloat16).cuda().eval()
    result = {"transformers_model": type(model).__name__}
    t1 = _time_generate(model, 1, 128, 64)
    result["hf_step_ms"] = 1000 * t1 / 64
    t256 = _time_generate(model, 256, 512, 256)
    result["hf_batch_tok_s"] = 256 * 256 / t256
    print(json.dumps(result, indent=2))
    (args.out / "hf.json").write_text(json.dumps(result, indent=2))


if __name__ == "__main__":
    main()
