"""FP8 and AWQ on the GPU: kernel correctness, speed against bf16, and weights memory.

Run on the GPU machine from the repository root (torch and triton importable; the tree's
packages installed or not: the script falls back to the source folders)::

    python benchmarks/quant_gpu.py --out results/quant_gpu.json [--quick]

Three parts, printed as tables and written as one JSON (command, GPU, torch/triton versions):

1. correctness on random data, per linear shape of Qwen3-0.6B and Llama-3.1-8B:
   - fp8 (``torch._scaled_mm``, dynamic per-tensor and per-token activations) against an
     fp32 emulation of the same W8A8 math (must agree to bf16 rounding), and against the
     dequantized-weight bf16 matmul (the activation quantization error, for information);
   - the AWQ layer (tiled layout, W4A16 kernels) against the torch dequantize reference
     in fp32.
2. speed: ``triton.testing.do_bench`` of each quantized layer's ``apply`` (what the engine
   runs, activation quantization included) and of the raw AWQ kernel, against
   ``F.linear`` in bf16, for 1 to 4096 tokens (``awq_kernel_ms``: the previous kernel on the
   checkpoint layout, ``engine_awq.triton_gemm``).
3. weights memory: both models built from their configs (random weights, no download)
   with bf16, online fp8 and AWQ (group 128) linear layers; parameter bytes and
   ``torch.cuda.memory_allocated``.
"""

from __future__ import annotations

import argparse
import json
import platform
import sys
import time
from pathlib import Path
from types import SimpleNamespace
from typing import Any

REPO = Path(__file__).resolve().parents[1]


def _import_paths() -> None:
    """Use installed packages when present, else the tree's source folders."""
    for folder in ("sdk", "plugins/fp8", "plugins/awq", "plugins/llama", "plugins/qwen3"):
        path = str(REPO / folder)
        if path not in sys.path:
            sys.path.append(path)


_import_paths()

import torch  # noqa: E402
import triton  # noqa: E402
from engine_awq.config import AwqConfig  # noqa: E402
from engine_awq.packing import awq_dequantize, awq_quantize  # noqa: E402
from engine_awq.triton_gemm import awq_gemm_triton  # noqa: E402
from engine_fp8 import quant_ops  # noqa: E402
from engine_fp8.config import Fp8Config  # noqa: E402
from engine_sdk.layers.linear import Linear  # noqa: E402
from report import git_commit as _git_commit  # noqa: E402
from report import table as _table  # noqa: E402

MODELS: dict[str, dict[str, Any]] = {
    "Qwen3-0.6B": {
        "architectures": ["Qwen3ForCausalLM"],
        "vocab_size": 151936,
        "hidden_size": 1024,
        "intermediate_size": 3072,
        "num_hidden_layers": 28,
        "num_attention_heads": 16,
        "num_key_value_heads": 8,
        "head_dim": 128,
        "max_position_embeddings": 40960,
        "rms_norm_eps": 1e-6,
        "rope_theta": 1000000.0,
        "tie_word_embeddings": True,
        "hidden_act": "silu",
    },
    "Llama-3.1-8B": {
        "architectures": ["LlamaForCausalLM"],
        "vocab_size": 128256,
        "hidden_size": 4096,
        "intermediate_size": 14336,
        "num_hidden_layers": 32,
        "num_attention_heads": 32,
        "num_key_value_heads": 8,
        "head_dim": 128,
        "max_position_embeddings": 131072,
        "rms_norm_eps": 1e-5,
        "tie_word_embeddings": False,
        "hidden_act": "silu",
        "rope_scaling": {
            "rope_type": "llama3",
            "rope_theta": 500000.0,
            "factor": 8.0,
            "low_freq_factor": 1.0,
            "high_freq_factor": 4.0,
            "original_max_position_embeddings": 8192,
        },
        "rope_theta": 500000.0,
    },
}
TOKENS = (1, 16, 64, 256, 1024, 4096)
DEVICE = torch.device("cuda")


def linear_shapes(cfg: dict[str, Any]) -> dict[str, tuple[int, int]]:
    """name -> (in, out) of one decoder layer's projections."""
    hidden, heads, kv = cfg["hidden_size"], cfg["num_attention_heads"], cfg["num_key_value_heads"]
    head_dim, inter = cfg["head_dim"], cfg["intermediate_size"]
    return {
        "q_proj": (hidden, heads * head_dim),
        "kv_proj": (hidden, kv * head_dim),
        "o_proj": (heads * head_dim, hidden),
        "gate_up": (hidden, inter),
        "down_proj": (inter, hidden),
    }


# -- layers ---------------------------------------------------------------------------


def fp8_layer(num_in: int, num_out: int, w: torch.Tensor, activation_strategy: str) -> Linear:
    cfg = Fp8Config.from_config({"activation_strategy": activation_strategy})
    layer = Linear(num_in, num_out, False, cfg, "bench", torch.bfloat16).to(DEVICE)
    layer.weight.data.copy_(w)
    layer.quant_method.process_weights_after_loading(layer)
    return layer


def awq_layer(num_in: int, num_out: int, w: torch.Tensor, group_size: int = 128) -> Linear:
    cfg = AwqConfig.from_config({"quant_method": "awq", "bits": 4, "group_size": group_size})
    layer = Linear(num_in, num_out, False, cfg, "bench", torch.bfloat16).to(DEVICE)
    qweight, qzeros, scales = awq_quantize(w.float(), group_size)
    layer.qweight.data.copy_(qweight)
    layer.qzeros.data.copy_(qzeros)
    layer.scales.data.copy_(scales)
    layer.quant_method.process_weights_after_loading(layer)
    return layer


def _rel(got: torch.Tensor, want: torch.Tensor) -> float:
    return float((got.float() - want.float()).abs().max() / want.float().abs().max())


# -- 1. correctness -------------------------------------------------------------------


def check_fp8(num_in: int, num_out: int, num_tokens: int, strategy: str) -> dict[str, Any]:
    gen = torch.Generator(device=DEVICE).manual_seed(0)
    w = torch.randn(num_out, num_in, device=DEVICE, generator=gen, dtype=torch.bfloat16) * 0.02
    x = torch.randn(num_tokens, num_in, device=DEVICE, generator=gen, dtype=torch.bfloat16)
    layer = fp8_layer(num_in, num_out, w, strategy)
    got = layer(x)
    if strategy == "token":
        qx, sx = quant_ops.quantize_per_token(x)
    else:
        qx, sx = quant_ops.quantize_per_tensor(x)
    emulated = (qx.float() * sx) @ (layer.weight.float() * layer.weight_scale.float()).t()
    dequant_w = quant_ops.dequantize(layer.weight, layer.weight_scale, torch.bfloat16)
    weight_only = torch.nn.functional.linear(x, dequant_w)
    err = _rel(got, emulated)
    return {
        "path": "scaled_mm" if layer.fp8_use_scaled_mm else "reference",
        "rel_err_vs_emulated": err,
        "rel_err_vs_weight_only": _rel(got, weight_only),
        "ok": layer.fp8_use_scaled_mm and err < 1e-2,
    }


def check_awq(num_in: int, num_out: int, num_tokens: int) -> dict[str, Any]:
    gen = torch.Generator(device=DEVICE).manual_seed(1)
    w = torch.randn(num_out, num_in, device=DEVICE, generator=gen) * 0.02
    x = torch.randn(num_tokens, num_in, device=DEVICE, generator=gen, dtype=torch.bfloat16)
    layer = awq_layer(num_in, num_out, w)  # on CUDA: the tiled layout and its kernels
    with torch.inference_mode():
        got = layer(x)
    qweight, qzeros, scales = awq_quantize(w.float(), 128)
    ref_w = awq_dequantize(qweight, qzeros, scales, 128, torch.float32)
    ref = x.float() @ ref_w
    err = _rel(got, ref)
    return {"rel_err_kernel_vs_reference": err, "ok": err < 2e-2}


# -- 2. speed -------------------------------------------------------------------------


def bench_ms(fn: Any) -> float:
    return float(triton.testing.do_bench(fn, warmup=25, rep=100))


def bench_shape(num_in: int, num_out: int, tokens: tuple[int, ...]) -> list[dict[str, Any]]:
    w = torch.randn(num_out, num_in, device=DEVICE, dtype=torch.bfloat16) * 0.02
    fp8_tensor = fp8_layer(num_in, num_out, w, "tensor")
    fp8_token = fp8_layer(num_in, num_out, w, "token")
    awq = awq_layer(num_in, num_out, w)
    old = [t.to(DEVICE) for t in awq_quantize(w.float(), 128)]  # the checkpoint layout
    rows = []
    for m in tokens:
        x = torch.randn(m, num_in, device=DEVICE, dtype=torch.bfloat16)
        row: dict[str, Any] = {"in": num_in, "out": num_out, "tokens": m}
        row["bf16_ms"] = bench_ms(lambda x=x: torch.nn.functional.linear(x, w))
        row["fp8_tensor_ms"] = bench_ms(lambda x=x: fp8_tensor(x))
        row["fp8_token_ms"] = bench_ms(lambda x=x: fp8_token(x))
        row["awq_ms"] = bench_ms(lambda x=x: awq(x))
        if m <= 256:
            row["awq_kernel_ms"] = bench_ms(
                lambda x=x: awq_gemm_triton(x, old[0], old[1], old[2], 128)
            )
        rows.append(row)
    return rows


# -- 3. weights memory ----------------------------------------------------------------


def _model_class(arch: str) -> Any:
    if arch == "Qwen3ForCausalLM":
        from engine_qwen3.model import Qwen3ForCausalLM

        return Qwen3ForCausalLM
    from engine_llama.model import LlamaForCausalLM

    return LlamaForCausalLM


def weights_memory(name: str, cfg: dict[str, Any], method: str) -> dict[str, Any]:
    from engine_sdk.interfaces.model import ModelContext
    from engine_sdk.interfaces.quantization import QuantizationMethod

    quant = {
        "bf16": None,
        "fp8": Fp8Config.from_config({}),
        "awq": AwqConfig.from_config({"quant_method": "awq", "bits": 4, "group_size": 128}),
    }[method]
    torch.cuda.empty_cache()
    before = torch.cuda.memory_allocated()
    ctx = ModelContext(
        hf_config=SimpleNamespace(**cfg),
        dtype=torch.bfloat16,
        device=DEVICE,
        block_size=16,
        make_attention=lambda layer_config: None,
        quant_config=quant,
    )
    with torch.device(DEVICE):
        model = _model_class(cfg["architectures"][0])(ctx)
    for param in model.parameters():  # random weights; the values do not matter here
        if param.is_floating_point() and param.element_size() >= 2:
            param.data.normal_(0, 0.02)
        elif not param.is_floating_point():
            param.data.random_(0, 2**31 - 1)
    for module in model.modules():
        if isinstance(getattr(module, "quant_method", None), QuantizationMethod):
            module.quant_method.process_weights_after_loading(module)
    torch.cuda.synchronize()
    torch.cuda.empty_cache()
    param_bytes = sum(p.numel() * p.element_size() for p in model.parameters())
    result = {
        "model": name,
        "method": method,
        "param_gib": param_bytes / 2**30,
        "allocated_gib": (torch.cuda.memory_allocated() - before) / 2**30,
    }
    del model
    torch.cuda.empty_cache()
    return result


# -- driver ---------------------------------------------------------------------------


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", required=True, help="JSON file to write")
    parser.add_argument("--quick", action="store_true", help="fewer token counts and shapes")
    args = parser.parse_args()
    if not torch.cuda.is_available():
        print("error: needs a CUDA GPU", file=sys.stderr)
        return 2
    tokens = (1, 64, 1024) if args.quick else TOKENS
    started = time.time()
    correctness, speed, memory = [], [], []
    for model_name, cfg in MODELS.items():
        for shape_name, (num_in, num_out) in linear_shapes(cfg).items():
            for m in (1, 37, 512):
                base = {"model": model_name, "shape": shape_name, "tokens": m}
                for strategy in ("tensor", "token"):
                    res = check_fp8(num_in, num_out, m, strategy)
                    correctness.append({**base, "kernel": f"fp8_{strategy}", **res})
                correctness.append(
                    {**base, "kernel": "awq_triton", **check_awq(num_in, num_out, m)}
                )
            if args.quick and shape_name not in ("q_proj", "gate_up"):
                continue
            for row in bench_shape(num_in, num_out, tokens):
                speed.append({"model": model_name, "shape": shape_name, **row})
        for method in ("bf16", "fp8", "awq"):
            memory.append(weights_memory(model_name, cfg, method))

    print("\n== correctness (relative max error) ==")
    print(
        _table(
            correctness,
            [
                "model",
                "shape",
                "tokens",
                "kernel",
                "path",
                "rel_err_vs_emulated",
                "rel_err_vs_weight_only",
                "rel_err_kernel_vs_reference",
                "ok",
            ],
        )
    )
    print("\n== speed (ms per call, triton.testing.do_bench) ==")
    print(
        _table(
            speed,
            [
                "model",
                "shape",
                "in",
                "out",
                "tokens",
                "bf16_ms",
                "fp8_tensor_ms",
                "fp8_token_ms",
                "awq_ms",
                "awq_kernel_ms",
            ],
        )
    )
    print("\n== weights memory (GiB) ==")
    print(_table(memory, ["model", "method", "param_gib", "allocated_gib"]))
    payload = {
        "command": " ".join(sys.argv),
        "git_commit": _git_commit(),
        "gpu": torch.cuda.get_device_name(),
        "capability": ".".join(map(str, torch.cuda.get_device_capability())),
        "torch": torch.__version__,
        "triton": triton.__version__,
        "python": platform.python_version(),
        "date": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
        "seconds": time.time() - started,
        "correctness": correctness,
        "speed": speed,
        "memory": memory,
    }
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(payload, indent=2))
    failed = [c for c in correctness if not c["ok"]]
    print(f"\nwrote {out}; {len(failed)} correctness check(s) failed")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
