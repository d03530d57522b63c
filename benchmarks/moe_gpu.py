"""Mixture of experts on the GPU: kernel tests and speed at the Qwen3-30B-A3B shape.

Run on the GPU machine from the repository root (the tree's packages installed, e.g. by
``benchmarks/run_moe_on_device.sh``; a tokenizer folder as for ``gpu_suite.py``)::

    python benchmarks/moe_gpu.py --out /tmp/moe --tokenizer-dir .gpu/tokenizer \
        [--parts kernel,decode,w1,share] [--num-prompts 1024]

Parts (results printed and written to ``OUT/moe_gpu.json``, with the command and versions):

- ``kernel``: ``engine_sdk.layers._moe_kernels.fused_moe`` (Triton, tokens sorted by
  expert, gate+up+SiLU fused) against ``moe_reference`` (torch) at hidden 2048,
  intermediate 768, 128 experts, top 8, for 1 .. 4096 tokens, in bf16 and fp32 (max abs
  error relative to the output's scale; fails the run above 2e-2 bf16 / 1e-4 fp32), then
  ``triton.testing.do_bench`` times of both paths and, for one token, the bandwidth the
  Triton path reaches on the 8 active experts' weights (3 * 2048 * 768 * 8 * 2 bytes).
- ``decode``: ``engine bench latency`` of Qwen3-30B-A3B (random bf16 weights,
  ``--load-format dummy``), batch 1, 128 prompt / 256 output tokens: ms per output token
  (issue target <= 2.5 ms; reading the ~3.3B active parameters takes ~1.6 ms).
- ``w1``: ``engine bench throughput`` 1024 prompts x 512 in / 256 out for Qwen3-30B-A3B
  and, beside it, the dense Qwen3-0.6B of ``gpu_suite.py``.
- ``share``: the MoE layers' share of a batch-1 decode step: 48 x the layer's time
  (routing + experts, one token) over the measured ms per token of ``decode``.

vLLM is not run: the vLLM archive in ../shared leaves out its compiled MoE ops.
"""

from __future__ import annotations

import argparse
import json
import platform
import shutil
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
for folder in ("sdk", "plugins/moe", "plugins/qwen3"):
    if str(REPO / folder) not in sys.path:
        sys.path.append(str(REPO / folder))

import torch  # noqa: E402
import triton  # noqa: E402
from engine_sdk.layers._moe_kernels import fused_moe  # noqa: E402
from engine_sdk.layers.moe import FusedMoE, moe_reference, route  # noqa: E402

QWEN3_30B_A3B: dict[str, Any] = {
    "architectures": ["Qwen3MoeForCausalLM"],
    "model_type": "qwen3_moe",
    "vocab_size": 151936,
    "hidden_size": 2048,
    "intermediate_size": 6144,
    "moe_intermediate_size": 768,
    "num_hidden_layers": 48,
    "num_attention_heads": 32,
    "num_key_value_heads": 4,
    "head_dim": 128,
    "num_experts": 128,
    "num_experts_per_tok": 8,
    "norm_topk_prob": True,
    "decoder_sparse_step": 1,
    "mlp_only_layers": [],
    "max_position_embeddings": 40960,
    "rms_norm_eps": 1e-6,
    "rope_theta": 1000000.0,
    "tie_word_embeddings": False,
    "torch_dtype": "bfloat16",
    "hidden_act": "silu",
    "attention_bias": False,
    "bos_token_id": 151643,
    "eos_token_id": 151645,
}
HIDDEN, INTER, EXPERTS, TOP_K, LAYERS = 2048, 768, 128, 8, 48
TOKEN_COUNTS = (1, 8, 64, 512, 4096)


def _problem(num_tokens: int, dtype: torch.dtype, seed: int = 0) -> list[torch.Tensor]:
    gen = torch.Generator(device="cuda").manual_seed(seed)
    x = torch.randn(num_tokens, HIDDEN, device="cuda", generator=gen)
    w13 = torch.randn(EXPERTS, 2 * INTER, HIDDEN, device="cuda", generator=gen) / HIDDEN**0.5
    w2 = torch.randn(EXPERTS, HIDDEN, INTER, device="cuda", generator=gen) / INTER**0.5
    logits = torch.randn(num_tokens, EXPERTS, device="cuda", generator=gen)
    return [t.to(dtype) for t in (x, w13, w2, logits)]


def part_kernel() -> dict[str, Any]:
    rows: list[dict[str, Any]] = []
    limits = {torch.bfloat16: 2e-2, torch.float32: 1e-4}
    for dtype in (torch.bfloat16, torch.float32):
        for num_tokens in TOKEN_COUNTS:
            x, w13, w2, logits = _problem(num_tokens, dtype)
            weights, ids = route(logits, TOP_K, True)
            want = moe_reference(x, w13, w2, weights, ids).float()
            got = fused_moe(x, w13, w2, weights, ids).float()
            rel = ((got - want).abs().max() / want.abs().max().clamp_min(1e-6)).item()
            args = (x, w13, w2, weights, ids)
            triton_ms = triton.testing.do_bench(lambda args=args: fused_moe(*args))
            torch_ms = triton.testing.do_bench(lambda args=args: moe_reference(*args))
            row = {
                "dtype": str(dtype).removeprefix("torch."),
                "tokens": num_tokens,
                "max_rel_error": rel,
                "ok": rel <= limits[dtype],
                "triton_ms": triton_ms,
                "torch_ms": torch_ms,
            }
            if num_tokens == 1:
                active_bytes = 3 * HIDDEN * INTER * TOP_K * x.element_size()
                row["triton_GB_per_s"] = active_bytes / triton_ms / 1e6
            rows.append(row)
            print(json.dumps(row), flush=True)
    return {"rows": rows, "all_ok": all(r["ok"] for r in rows)}


def part_share(ms_per_token: float | None) -> dict[str, Any]:
    """One MoE layer (router matmul excluded: a 2048 x 128 GEMV) at one token, x48."""
    layer = FusedMoE(EXPERTS, TOP_K, HIDDEN, INTER, True, torch.bfloat16).cuda()
    torch.nn.init.normal_(layer.w13, std=0.02)
    torch.nn.init.normal_(layer.w2, std=0.02)
    x = torch.randn(1, HIDDEN, device="cuda", dtype=torch.bfloat16)
    logits = torch.randn(1, EXPERTS, device="cuda", dtype=torch.bfloat16)
    layer_ms = triton.testing.do_bench(lambda: layer(x, logits))
    result: dict[str, Any] = {
        "moe_layer_ms_1_token": layer_ms,
        "moe_ms_per_step": LAYERS * layer_ms,
    }
    if ms_per_token:
        result["moe_share_of_decode_step"] = LAYERS * layer_ms / ms_per_token
    return result


def _model_dir(root: Path, name: str, config: dict[str, Any], tokenizer_dir: Path) -> Path:
    path = root / name
    path.mkdir(parents=True, exist_ok=True)
    (path / "config.json").write_text(json.dumps(config, indent=2))
    for f in tokenizer_dir.iterdir():
        if f.is_file():
            shutil.copy(f, path / f.name)
    return path


def _bench(out: Path, name: str, args: list[str], timeout: int = 1800) -> dict[str, Any] | None:
    result = out / f"{name}.json"
    cmd = [sys.executable, "-m", "engine.cli.main", "bench", *args, "--save-result", str(result)]
    print("$", " ".join(cmd), flush=True)
    with (out / f"{name}.log").open("w") as log:
        code = subprocess.run(cmd, stdout=log, stderr=subprocess.STDOUT, timeout=timeout).returncode
    print("\n".join((out / f"{name}.log").read_text().splitlines()[-15:]), flush=True)
    if code != 0 or not result.exists():
        print(f"!! {name} failed (exit {code}); see {name}.log", flush=True)
        return None
    return dict(json.loads(result.read_text()))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--tokenizer-dir", type=Path, required=True)
    parser.add_argument("--parts", default="kernel,decode,w1,share")
    parser.add_argument("--num-prompts", type=int, default=1024)
    args = parser.parse_args()
    out: Path = args.out
    out.mkdir(parents=True, exist_ok=True)
    parts = args.parts.split(",")
    results: dict[str, Any] = {
        "command": " ".join(sys.argv),
        "gpu": torch.cuda.get_device_name(),
        "torch": torch.__version__,
        "triton": triton.__version__,
        "python": platform.python_version(),
        "started": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
    }
    summary = out / "moe_gpu.json"

    def save() -> None:
        summary.write_text(json.dumps(results, indent=2))

    models = out / "models"
    moe = _model_dir(models, "qwen3-30b-a3b", QWEN3_30B_A3B, args.tokenizer_dir)
    common = ["--load-format", "dummy", "--dtype", "bfloat16"]
    if "kernel" in parts:
        results["kernel"] = part_kernel()
        save()
    if "decode" in parts:
        results["decode"] = _bench(
            out,
            "moe_decode",
            ["latency", "--model", str(moe), *common, "--batch-size", "1", "--input-len", "128"]
            + ["--output-len", "256", "--num-iters", "3", "--num-iters-warmup", "1"],
        )
        save()
    if "w1" in parts:
        w1 = ["--num-prompts", str(args.num_prompts), "--input-len", "512", "--output-len", "256"]
        results["w1_moe"] = _bench(out, "moe_w1", ["throughput", "--model", str(moe), *common, *w1])
        save()
        sys.path.insert(0, str(REPO / "benchmarks"))
        from gpu_suite import QWEN3_0_6B

        dense = _model_dir(models, "qwen3-0.6b", QWEN3_0_6B, args.tokenizer_dir)
        results["w1_dense_0_6b"] = _bench(
            out, "dense_w1", ["throughput", "--model", str(dense), *common, *w1]
        )
        save()
    if "share" in parts:
        decode = results.get("decode") or {}
        results["share"] = part_share(decode.get("ms_per_output_token"))
        save()
    print(json.dumps(results, indent=2))
    kernel = results.get("kernel")
    if kernel is not None and not kernel["all_ok"]:
        sys.exit(1)


if __name__ == "__main__":
    main()
