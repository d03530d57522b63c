"""GPU memory profiling: weights, peak activations of a worst-case step, other memory.

The profiling step packs ``max_num_batched_tokens`` tokens into ``max_num_seqs``
sequences (each at most ``max_model_len``), runs the model, computes logits for one row
per sequence and samples them with top-k/top-p (the sampler's heaviest path). The KV
cache is a single block per layer, so it barely counts; the real cache is sized from
what is left.
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING

import torch

from engine.core.request import ReqId, Request
from engine.core.scheduler_output import ScheduledRequest, SchedulerOutput
from engine.model_executor.inputs import build_step_inputs
from engine.model_executor.memory import MemoryProfile
from engine.sampling_params import SamplingParams

if TYPE_CHECKING:
    from engine.model_executor.runner import ModelRunner

__all__ = ["dummy_scheduler_output", "profile_gpu_memory"]


def dummy_scheduler_output(
    num_tokens: int, max_num_seqs: int, max_model_len: int, block_size: int
) -> SchedulerOutput:
    """Prefill-only step of ``num_tokens`` tokens over up to ``max_num_seqs`` sequences."""
    num_seqs = max(1, min(max_num_seqs, num_tokens))
    per_seq = [num_tokens // num_seqs] * num_seqs
    per_seq[0] += num_tokens - sum(per_seq)
    per_seq = [min(n, max_model_len) for n in per_seq if n > 0]
    params = SamplingParams(temperature=1.0, top_k=50, top_p=0.9, max_tokens=1)
    scheduled = []
    for i, n in enumerate(per_seq):
        req = Request(ReqId(f"profile-{i}"), [0] * n, params)
        block_ids = [0] * math.ceil(n / block_size)
        scheduled.append(ScheduledRequest(req.req_id, [0] * n, 0, block_ids, True, req))
    return SchedulerOutput(scheduled=scheduled, num_scheduled_tokens=sum(per_seq))


def profile_gpu_memory(
    runner: ModelRunner, free_bytes_at_start: int, num_tokens: int
) -> MemoryProfile:
    """Run the profiling step on ``runner`` (weights already loaded, no KV cache yet)."""
    device = runner.device
    torch.cuda.synchronize(device)
    weights_bytes = torch.cuda.memory_allocated(device)
    torch.cuda.reset_peak_memory_stats(device)
    so = dummy_scheduler_output(
        num_tokens, runner.args.max_num_seqs, runner.max_model_len, runner.block_size
    )
    caches = runner.allocate_kv_caches(num_blocks=1)
    with torch.inference_mode():
        inputs = build_step_inputs(so, runner.block_size, device, {})
        logits = runner.run_model(inputs, caches)
        runner.sample(logits, inputs)
    torch.cuda.synchronize(device)
    peak = torch.cuda.max_memory_allocated(device)
    del caches, logits, inputs
    torch.cuda.empty_cache()
    free_now, total = torch.cuda.mem_get_info(device)
    # What grew outside torch's allocator since startup (CUDA context, cuBLAS workspaces).
    non_torch = max(0, (free_bytes_at_start - free_now) - torch.cuda.memory_reserved(device))
    return MemoryProfile(
        total_bytes=total,
        free_bytes_at_start=free_bytes_at_start,
        weights_bytes=weights_bytes,
        peak_activation_bytes=max(0, peak - weights_bytes),
        non_torch_bytes=non_torch,
    )
