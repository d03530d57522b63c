"""Multi-LoRA serving on the GPU: kernel check and speed, W1-style throughput, batch-1 decode.

Run on the GPU machine from the repository root::

    PYTHONPATH=core:sdk:plugins/reference:plugins/qwen3:plugins/triton \\
        python benchmarks/lora_gpu.py --out FILE [--num-prompts 1024] [--quick]

A Qwen3-0.6B-shaped model with random weights (``--load-format dummy``, bfloat16) and four
random rank-16 PEFT adapters on all seven projections (q/k/v/o, gate/up/down), written to a
temporary folder. Parts, each configuration in its own process (the whole GPU each):

1. kernels: the Triton shrink/expand against the torch reference in bf16 (max error), and
   the time of one projection's LoRA work next to its base GEMM (q/k/v merged, down_proj)
   for 1 to 4096 tokens, 4 adapters in the batch;
2. W1-style offline throughput (512 prompt + 256 output tokens, ``--num-prompts``): base
   model without ``--enable-lora``; with LoRA on but only base requests; requests spread
   round-robin over the 4 adapters and the base model (``--max-loras 4``);
3. batch-1 decode ms per output token (128 prompt + 256 output tokens): base without LoRA,
   base requests with LoRA on, one adapter, one adapter with ``--lora-merge-single-adapter``
   (``adapter_merged``).

Prints a table and writes one JSON (command, GPU, versions, every figure) to ``--out``.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
for _folder in ("core", "sdk", "plugins/reference", "plugins/qwen3", "plugins/triton"):
    if str(REPO / _folder) not in sys.path:
        sys.path.append(str(REPO / _folder))

QWEN3_0_6B: dict[str, Any] = {
    "architectures": ["Qwen3ForCausalLM"],
    "model_type": "qwen3",
    "vocab_size": 151936,
    "hidden_size": 1024,
    "intermediate_size": 3072,
    "num_hidden_layers": 28,
    "num_attention_heads": 16,
    "num_key_value_heads": 8,
    "head_dim": 128,
    "max_position_embeddings": 40960,
    "rms_norm_eps": 1e-6,
    "rope_theta": 1000000,
    "tie_word_embeddings": True,
    "torch_dtype": "bfloat16",
    "hidden_act": "silu",
    "attention_bias": False,
    "bos_token_id": 151643,
    "eos_token_id": 151645,
}
TARGETS = ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]
RANK = 16
NUM_ADAPTERS = 4


# -- the model and adapters on disk ---------------------------------------------------------


def make_model(root: Path) -> Path:
    from engine_sdk.testing.models import build_tiny_tokenizer

    path = root / "qwen3-0.6b"
    path.mkdir(parents=True, exist_ok=True)
    (path / "config.json").write_text(json.dumps(QWEN3_0_6B, indent=2))
    build_tiny_tokenizer(path)  # prompts are token ids; the tokenizer only decodes
    return path


def make_adapter(root: Path, name: str, seed: int) -> Path:
    """A PEFT folder written directly (no peft import): rank 16 on all projections, bf16."""
    import torch
    from engine_sdk.testing.lora import write_lora_adapter

    return write_lora_adapter(
        root / name, QWEN3_0_6B, RANK, targets=TARGETS, seed=seed, scale=0.01,
        dtype=torch.bfloat16, base_model_name="Qwen/Qwen3-0.6B",
    )  # fmt: skip


# -- one configuration (a subprocess) -------------------------------------------------------


def _llm(model: Path, lora: bool, max_loras: int, merge: bool = False) -> Any:
    from engine import LLM

    kwargs: dict[str, Any] = {"load_format": "dummy", "dtype": "bfloat16", "max_model_len": 2048}
    if lora:
        kwargs.update(enable_lora=True, max_loras=max_loras, max_lora_rank=RANK)
        kwargs.update(lora_merge_single_adapter=merge)
    return LLM(str(model), **kwargs)


def _prompts(num: int, length: int, seed: int) -> list[dict[str, list[int]]]:
    import random

    rng = random.Random(seed)
    return [
        {"prompt_token_ids": [rng.randrange(1000, 100000) for _ in range(length)]}
        for _ in range(num)
    ]


def worker(spec: dict[str, Any]) -> dict[str, Any]:
    from engine import LoRARequest, SamplingParams
    from kernel_profile import profile_generate

    model = Path(spec["model"])
    adapters = [LoRARequest(f"a{i}", i + 1, p) for i, p in enumerate(spec["adapters"])]
    llm = _llm(model, spec["lora"], spec.get("max_loras", 1), spec.get("merge", False))
    if spec["kind"] == "throughput":
        params = SamplingParams(temperature=0.0, max_tokens=256, ignore_eos=True)
        pool: list[Any] = {"base": [None], "mixed": [*adapters, None]}[spec["requests"]]
        loras = [pool[i % len(pool)] for i in range(spec["num_prompts"])]
        warm = _prompts(8, 512, 1000)
        llm.generate(warm, params, use_tqdm=False, lora_request=loras[:8])  # warm up
        from w4_profile_gpu import StepTimeline  # where a run's time goes: prefill or decode

        timeline = StepTimeline()
        runs = []
        # the last run is the figure; each run its own prompts (no prefix-cache hits)
        for run in range(spec.get("runs", 1)):
            prompts = _prompts(spec["num_prompts"], 512, run)
            timeline.reset()
            start = time.perf_counter()
            outs = llm.generate(prompts, params, use_tqdm=False, lora_request=loras)
            elapsed = time.perf_counter() - start
            num_out = sum(len(o.outputs[0].token_ids) for o in outs)
            runs.append({
                "elapsed_s": elapsed,
                "output_tokens": num_out,
                "output_tokens_per_s": num_out / elapsed,
                "steps": timeline.summary(),
            })  # fmt: skip
        result = {**runs[-1], "runs": runs}
        if spec.get("profile"):
            fresh = _prompts(spec["num_prompts"], 512, 99)  # not cached by the runs
            result["profile"] = profile_generate(llm, fresh, params, lora_request=loras)
        return result
    prompts = _prompts(1, 128, 1)
    params = SamplingParams(temperature=0.0, max_tokens=256, ignore_eos=True)
    lora = adapters[0] if spec["requests"] == "adapter" else None
    for _ in range(2):
        llm.generate(prompts, params, use_tqdm=False, lora_request=lora)
    times = []
    for _ in range(5):
        start = time.perf_counter()
        llm.generate(prompts, params, use_tqdm=False, lora_request=lora)
        times.append(time.perf_counter() - start)
    times.sort()
    result = {"latency_s_p50": times[2], "ms_per_output_token": 1000 * times[2] / 256}
    if spec.get("profile"):  # per output token: divide by 256
        result["profile"] = profile_generate(llm, prompts, params, lora_request=lora)
    return result


def _brief(result: dict[str, Any] | None) -> Any:
    """A result without its kernel table (printed apart) and run list."""
    if result is None:
        return None
    return {k: v for k, v in result.items() if k not in ("profile", "runs")}


def run_worker(spec: dict[str, Any], log_dir: Path) -> dict[str, Any] | None:
    spec_file = log_dir / f"{spec['name']}.spec.json"
    result_file = log_dir / f"{spec['name']}.result.json"
    spec_file.write_text(json.dumps(spec))
    cmd = [sys.executable, __file__, "--worker", str(spec_file), "--out", str(result_file)]
    print("$", spec["name"], flush=True)
    with (log_dir / f"{spec['name']}.log").open("w") as log:
        proc = subprocess.run(cmd, stdout=log, stderr=subprocess.STDOUT, timeout=1800)
    if proc.returncode != 0:
        tail = (log_dir / f"{spec['name']}.log").read_text().splitlines()[-30:]
        print("\n".join(tail), flush=True)
        return None
    result: dict[str, Any] = json.loads(result_file.read_text())
    if "profile" in result:
        from kernel_profile import print_profile

        print_profile(spec["name"], result["profile"])
    return result


# -- 1. kernels -----------------------------------------------------------------------------


def part_kernels(quick: bool) -> dict[str, Any]:
    import torch
    import triton
    from engine_sdk.layers.lora import (
        LoRAContext,
        LoRALayer,
        lora_expand_reference,
        lora_expand_triton,
        lora_shrink_reference,
        lora_shrink_triton,
    )
    from engine_sdk.layers.lora_dense import block_bt, lora_apply_dense

    dev = torch.device("cuda")
    out: dict[str, Any] = {"check": [], "speed": []}
    for tokens in (1, 37, 512):
        x = torch.randn(tokens, 1024, device=dev, dtype=torch.bfloat16)
        a = torch.randn(4, 3 * RANK, 1024, device=dev, dtype=torch.bfloat16) * 0.05
        b = torch.randn(4, 4096, RANK, device=dev, dtype=torch.bfloat16) * 0.05
        slots = torch.randint(-1, 4, (tokens,), device=dev, dtype=torch.int32)
        h_ref, h_tri = lora_shrink_reference(x, a, slots), lora_shrink_triton(x, a, slots)
        y0 = torch.randn(tokens, 4096, device=dev, dtype=torch.bfloat16)
        y_ref, y_tri = y0.clone(), y0.clone()
        lora_expand_reference(y_ref, h_ref[:, :RANK], b, slots)
        lora_expand_triton(y_tri, h_ref[:, :RANK], b, slots)
        out["check"].append({
            "tokens": tokens,
            "shrink_max_err": float((h_ref - h_tri).abs().max()),
            "expand_max_err": float((y_ref.float() - y_tri.float()).abs().max()),
        })  # fmt: skip
    shapes = {"qkv_proj": (1024, [2048, 1024, 1024]), "down_proj": (3072, [1024])}
    for name, (n_in, sizes) in shapes.items():
        for tokens in (1, 16, 256, 4096) if quick else (1, 16, 64, 256, 1024, 4096, 8192):
            ctx = LoRAContext(tokens, dev)
            layer = LoRALayer(ctx, 4, RANK, n_in, sizes, torch.bfloat16, dev)
            layer.lora_a.normal_(std=0.05)
            layer.lora_b.normal_(std=0.05)
            layer.lora_bt.copy_(block_bt(layer.lora_b, sizes))
            ctx.token_slots.copy_(torch.arange(tokens, device=dev, dtype=torch.int32) % 5 - 1)
            ctx.active = True
            x = torch.randn(tokens, n_in, device=dev, dtype=torch.bfloat16)
            w = torch.randn(sum(sizes), n_in, device=dev, dtype=torch.bfloat16) * 0.02
            y = torch.nn.functional.linear(x, w)
            base = triton.testing.do_bench(lambda x=x, w=w: torch.nn.functional.linear(x, w))
            lora = triton.testing.do_bench(lambda x=x, y=y, layer=layer: layer.apply(x, y))
            slots = ctx.token_slots[:tokens]
            dense, dense_torch = (
                triton.testing.do_bench(
                    lambda x=x, y=y, layer=layer, slots=slots, e=expand: lora_apply_dense(
                        x, y, layer.lora_a, layer.lora_bt, slots, layer.slot_onehot, e
                    )
                )
                for expand in ("triton", "torch")
            )
            kernels = triton.testing.do_bench(
                lambda x=x, y=y, layer=layer, slots=slots: lora_expand_triton(
                    y, lora_shrink_triton(x, layer.lora_a, slots, parts=True), layer.lora_b,
                    slots, layer.slices,
                )
            )  # fmt: skip
            out["speed"].append({
                "projection": name, "tokens": tokens, "base_gemm_ms": base, "lora_ms": lora,
                "lora_over_base": lora / base, "dense_ms": dense, "dense_torch_ms": dense_torch,
                "kernels_ms": kernels,
            })  # fmt: skip
    return out


# -- the table ------------------------------------------------------------------------------


def print_table(results: dict[str, Any]) -> None:
    rows: list[tuple[str, str, str]] = []
    for c in results.get("kernels", {}).get("check", []):
        rows.append(
            (f"kernel check, {c['tokens']} tokens (max abs err vs torch)",
             f"{c['shrink_max_err']:.2e} / {c['expand_max_err']:.2e}", "shrink / expand")
        )  # fmt: skip
    for s in results.get("kernels", {}).get("speed", []):
        base_us = s["base_gemm_ms"] * 1000
        rows.append(
            (
                f"{s['projection']} LoRA, {s['tokens']} tokens, 4 adapters",
                f"{s['lora_ms'] * 1000:.1f} us",
                f"{s['lora_over_base']:.2f}x base GEMM ({base_us:.1f} us); dense "
                f"{s['dense_ms'] * 1000:.1f} us (torch expand "
                f"{s.get('dense_torch_ms', float('nan')) * 1000:.1f}), "
                f"kernels {s['kernels_ms'] * 1000:.1f} us",
            )
        )
    w1 = results.get("w1", {})
    base = (w1.get("base") or {}).get("output_tokens_per_s")
    for key, label in (
        ("base", "W1 base, LoRA off (out tok/s)"),
        ("base_lora_on", "W1 base requests, LoRA on"),
        ("mixed", "W1 4 adapters + base, round-robin"),
    ):
        if key not in w1:  # part not run
            continue
        r = w1.get(key)
        value = "failed" if r is None else f"{r['output_tokens_per_s']:.0f}"
        ratio = f"{r['output_tokens_per_s'] / base:.0%} of base" if r and base else ""
        rows.append((label, value, ratio))
    lat = results.get("decode", {})
    base_ms = (lat.get("base") or {}).get("ms_per_output_token")
    for key, label in (
        ("base", "batch-1 decode, LoRA off (ms/token)"),
        ("base_lora_on", "batch-1 decode, base request, LoRA on"),
        ("adapter", "batch-1 decode, one adapter"),
        ("adapter_merged", "batch-1 decode, one adapter, --lora-merge-single-adapter"),
    ):
        if key not in lat:
            continue
        r = lat.get(key)
        value = "failed" if r is None else f"{r['ms_per_output_token']:.3f}"
        ratio = f"{r['ms_per_output_token'] / base_ms:.2f}x base" if r and base_ms else ""
        rows.append((label, value, ratio))
    width = max(len(r[0]) for r in rows)
    for name, value, note in rows:
        print(f"{name:<{width}}  {value:>22}  {note}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--num-prompts", type=int, default=1024)
    parser.add_argument("--quick", action="store_true", help="fewer prompts and shapes")
    parser.add_argument("--parts", default="kernels,w1,decode", help="which parts, in order")
    parser.add_argument(
        "--decode-runs",
        default="base,base_lora_on,adapter,adapter_merged",
        help="the decode part's runs",
    )
    parser.add_argument(
        "--w1-configs", default="base,base_lora_on,mixed", help="the W1 part's configurations"
    )
    parser.add_argument(
        "--w1-runs", type=int, default=1, help="W1 runs per configuration; the last is reported"
    )
    parser.add_argument(
        "--profile", action="store_true", help="also a kernel table of each run (torch.profiler)"
    )
    parser.add_argument("--worker", type=Path, help=argparse.SUPPRESS)
    args = parser.parse_args()
    parts = args.parts.split(",")
    if args.worker is not None:
        result = worker(json.loads(args.worker.read_text()))
        args.out.write_text(json.dumps(result))
        return
    import torch
    import triton

    num_prompts = 128 if args.quick else args.num_prompts
    results: dict[str, Any] = {
        "command": " ".join(sys.argv),
        "gpu": torch.cuda.get_device_name(0),
        "torch": torch.__version__,
        "triton": triton.__version__,
        "python": platform.python_version(),
        "date": time.strftime("%Y-%m-%d %H:%M:%S"),
        "num_prompts": num_prompts,
    }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    if "kernels" in parts:
        results["kernels"] = part_kernels(args.quick)
    with tempfile.TemporaryDirectory(prefix="lora-bench-") as tmp:
        root = Path(tmp)
        model = make_model(root)
        adapters = [str(make_adapter(root, f"a{i}", i)) for i in range(NUM_ADAPTERS)]
        common = {"model": str(model), "adapters": adapters}
        w1_runs = (
            ("base", False, "base"), ("base_lora_on", True, "base"), ("mixed", True, "mixed"),
        ) if "w1" in parts else ()  # fmt: skip
        w1_runs = tuple(r for r in w1_runs if r[0] in args.w1_configs.split(","))
        results["w1"] = {}
        for name, lora, requests in w1_runs:
            spec = {
                **common, "name": f"w1_{name}", "kind": "throughput", "lora": lora,
                "max_loras": NUM_ADAPTERS, "requests": requests, "num_prompts": num_prompts,
                "profile": args.profile, "runs": args.w1_runs,
            }  # fmt: skip
            results["w1"][name] = run_worker(spec, root)
            print(f"w1 {name}: {_brief(results['w1'][name])}", flush=True)
            args.out.write_text(json.dumps(results, indent=2))
        decode_runs = (
            ("base", False, "base"), ("base_lora_on", True, "base"), ("adapter", True, "adapter"),
            ("adapter_merged", True, "adapter"),
        ) if "decode" in parts else ()  # fmt: skip
        decode_runs = tuple(r for r in decode_runs if r[0] in args.decode_runs.split(","))
        results["decode"] = {}
        for name, lora, requests in decode_runs:
            spec = {**common, "name": f"decode_{name}", "kind": "latency", "lora": lora,
                    "max_loras": 1, "requests": requests, "profile": args.profile,
                    "merge": name.endswith("_merged")}  # fmt: skip
            results["decode"][name] = run_worker(spec, root)
            print(f"decode {name}: {_brief(results['decode'][name])}", flush=True)
            args.out.write_text(json.dumps(results, indent=2))
    args.out.write_text(json.dumps(results, indent=2))
    print_table(results)
    print(f"wrote {args.out}")


if __name__ == "__main__":
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    main()
