"""Embedding models on the GPU: parity with transformers and throughput (not run yet).

Builds tiny random Qwen3 (last-token pooling) and Llama (mean pooling) checkpoints, embeds
prompts with ``LLM(task="embed")`` on CUDA (float32: cosine with transformers' body must
be >= 0.9999; bfloat16: the minimum cosine is reported), then times ``--num-prompts``
prompts of ``--prompt-len`` tokens on a real-shaped random Qwen3 body (dummy weights).
Writes embeddings_gpu.json under --out.

    python benchmarks/embeddings_gpu.py --out /tmp/emb
"""

from __future__ import annotations

import argparse
import gc
import json
import random
import time
from pathlib import Path
from typing import Any

import torch
from engine import LLM


def _parity(model_dir: Path, pooling: str, dtype: str, prompts: list[list[int]]) -> float:
    from transformers import AutoModel

    llm = LLM(str(model_dir), task="embed", device="cuda", dtype=dtype,
              gpu_memory_utilization=0.3, max_num_batched_tokens=64)  # fmt: skip
    outs = llm.embed([{"prompt_token_ids": p} for p in prompts], use_tqdm=False)
    del llm
    gc.collect()
    ref = AutoModel.from_pretrained(str(model_dir), dtype=torch.float32).cuda()
    cosines = []
    with torch.no_grad():
        for p, o in zip(prompts, outs, strict=True):
            hidden = ref(torch.tensor([p], device="cuda")).last_hidden_state[0]
            pooled = hidden[-1] if pooling == "last" else hidden.mean(dim=0)
            expected = torch.nn.functional.normalize(pooled, dim=0)
            got = torch.tensor(o.embedding, device="cuda")
            cosines.append(float(torch.dot(expected, got)))
    del ref
    torch.cuda.empty_cache()
    return min(cosines)


def _throughput(model_dir: Path, num_prompts: int, prompt_len: int) -> dict[str, Any]:
    llm = LLM(str(model_dir), task="embed", device="cuda", dtype="bfloat16",
              load_format="dummy", gpu_memory_utilization=0.6)  # fmt: skip
    rng = random.Random(0)
    prompts = [
        {"prompt_token_ids": [rng.randrange(100, 30000) for _ in range(prompt_len)]}
        for _ in range(num_prompts)
    ]
    llm.embed(prompts[:8], use_tqdm=False)  # warm-up
    start = time.perf_counter()
    llm.embed(prompts, use_tqdm=False)
    elapsed = time.perf_counter() - start
    del llm
    gc.collect()
    torch.cuda.empty_cache()
    return {
        "num_prompts": num_prompts,
        "prompt_len": prompt_len,
        "seconds": elapsed,
        "embeddings_per_s": num_prompts / elapsed,
        "tokens_per_s": num_prompts * prompt_len / elapsed,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--num-prompts", type=int, default=2048)
    parser.add_argument("--prompt-len", type=int, default=256)
    args = parser.parse_args()
    from engine_sdk.testing.models import build_tiny_model

    args.out.mkdir(parents=True, exist_ok=True)
    rng = random.Random(1)
    prompts = [[rng.randrange(10, 380) for _ in range(n)] for n in (3, 17, 64, 200)]
    result: dict[str, Any] = {"parity": {}}
    for arch, pooling in (("Qwen3ForCausalLM", "last"), ("LlamaForCausalLM", "mean")):
        model_dir = build_tiny_model(args.out / arch, arch, max_position_embeddings=1024)
        for dtype in ("float32", "bfloat16"):
            cosine = _parity(model_dir, pooling, dtype, prompts)
            result["parity"][f"{arch}/{dtype}"] = cosine
            print(f"{arch} {dtype}: min cosine {cosine:.6f}", flush=True)
    real = args.out / "qwen3-0.6b-shape"
    real.mkdir(exist_ok=True)
    config = {
        "architectures": ["Qwen3Model"], "model_type": "qwen3", "hidden_size": 1024,
        "intermediate_size": 3072, "num_hidden_layers": 28, "num_attention_heads": 16,
        "num_key_value_heads": 8, "head_dim": 128, "vocab_size": 151669,
        "max_position_embeddings": 4096, "rms_norm_eps": 1e-6, "rope_theta": 1000000,
        "torch_dtype": "bfloat16", "tie_word_embeddings": True,
    }  # fmt: skip
    (real / "config.json").write_text(json.dumps(config))
    for name in ("tokenizer.json", "tokenizer_config.json"):
        src = args.out / "Qwen3ForCausalLM" / name
        if src.exists():
            (real / name).write_bytes(src.read_bytes())
    result["throughput"] = _throughput(real, args.num_prompts, args.prompt_len)
    print(json.dumps(result["throughput"]), flush=True)
    (args.out / "embeddings_gpu.json").write_text(json.dumps(result, indent=2))
    assert all(v >= 0.9999 for k, v in result["parity"].items() if k.endswith("float32"))


if __name__ == "__main__":
    main()
