"""Device time by kernel for one offline ``generate`` (torch.profiler, CUDA events only).

    from kernel_profile import profile_generate
    table = profile_generate(llm, prompts, params, top=25, lora_request=...)

Returns the device-busy time (ms, all kernels summed), the wall time of the call (ms) and
the ``top`` kernels by total device time, each with its launch count, total ms and mean us.
Shared by the GPU benchmarks that need to say where a step's time goes
(``structured_e2e_gpu.py --profile``, ``lora_gpu.py --profile``).
"""

from __future__ import annotations

import time
from typing import Any

import torch


def _sync() -> None:
    if torch.cuda.is_available():
        torch.cuda.synchronize()


def profile_generate(
    llm: Any, prompts: Any, params: Any, top: int = 25, **kwargs: Any
) -> dict[str, Any]:
    from torch.profiler import ProfilerActivity, profile

    _sync()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        start = time.perf_counter()
        llm.generate(prompts, params, use_tqdm=False, **kwargs)
        _sync()
        wall = time.perf_counter() - start
    kernels: dict[str, list[float]] = {}
    for event in prof.events():
        if event.device_type == torch.autograd.DeviceType.CUDA:
            kernels.setdefault(event.name[:90], []).append(event.device_time_total)
    rows = sorted(kernels.items(), key=lambda kv: -sum(kv[1]))[:top]
    return {
        "wall_ms": 1000 * wall,
        "device_busy_ms": sum(sum(v) for v in kernels.values()) / 1000,
        "launches": sum(len(v) for v in kernels.values()),
        "top": [
            {"name": n, "count": len(v), "ms": sum(v) / 1000, "mean_us": sum(v) / len(v)}
            for n, v in rows
        ],
    }


def print_profile(name: str, table: dict[str, Any], rows: int = 12) -> None:
    print(
        f"{name}: wall {table['wall_ms']:.1f} ms, device busy {table['device_busy_ms']:.1f} ms, "
        f"{table['launches']} launches",
        flush=True,
    )
    for r in table["top"][:rows]:
        print(
            f"  {r['ms']:9.2f} ms {r['count']:7d}x {r['mean_us']:8.2f} us  {r['name']}", flush=True
        )
