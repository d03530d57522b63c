"""One tensor-parallel rank: its device, its ``torch.distributed`` group, its model shard.

A worker pins its GPU (rank r uses ``cuda:r`` of the visible devices) or, on the CPU,
takes its share of the cores; joins the process group (NCCL on GPUs, gloo on the CPU);
then builds an ordinary :class:`ModelRunner` inside ``tensor_parallel(group)``, so the
model's layers build this rank's shards and load only their slices of each checkpoint
tensor. The runner plans this rank's KV cache itself; the engine uses the smallest block
count of all ranks (blocks past it are allocated but never handed out).
"""

from __future__ import annotations

import logging
import os
from datetime import timedelta
from typing import Any

import torch
from engine_sdk.layers.parallel import TensorParallelGroup, tensor_parallel

from engine.config import EngineArgs
from engine.core.scheduler_output import ModelRunnerOutput, SchedulerOutput
from engine.model_executor.loader import resolve_device

logger = logging.getLogger(__name__)

__all__ = ["Worker"]

# Collectives wait this long for a peer; the engine notices dead workers much sooner.
_COLLECTIVE_TIMEOUT = timedelta(minutes=30)


class Worker:
    def __init__(self, args: EngineArgs, rank: int, world_size: int, init_method: str) -> None:
        self.args = args
        self.rank = rank
        self.world_size = world_size
        self.device = self._pin_device(resolve_device(args.device))
        self.tp = self._init_distributed(init_method)
        self.runner = self._build_runner()

    def _pin_device(self, device: torch.device) -> torch.device:
        if device.type == "cuda":
            local_rank = self.rank % max(1, self.world_size // self.args.nnodes)  # --nnodes
            torch.cuda.set_device(local_rank)
            return torch.device("cuda", local_rank)
        # Ranks share the host's cores; oversubscribed BLAS threads slow every rank.
        torch.set_num_threads(max(1, (os.cpu_count() or 1) // self.world_size))
        return device

    def _init_distributed(self, init_method: str) -> TensorParallelGroup:
        import torch.distributed as dist

        cuda = self.device.type == "cuda"
        dist.init_process_group(
            "nccl" if cuda else "gloo",
            init_method=init_method,
            rank=self.rank,
            world_size=self.world_size,
            timeout=_COLLECTIVE_TIMEOUT,
            device_id=self.device if cuda else None,
        )
        tp = TensorParallelGroup(self.rank, self.world_size, dist.group.WORLD)
        # One collective now, so communicators exist before profiling or graph capture.
        tp.all_reduce(torch.ones(1, device=self.device))
        return tp

    def _build_runner(self) -> Any:
        from engine.model_executor.runner import ModelRunner
        from engine.model_executor.source import open_model_source
        from engine.plugins import PluginManager

        pm = PluginManager.load(requested=self.args.plugins)
        source = open_model_source(self.args, pm)
        with tensor_parallel(self.tp):
            return ModelRunner(self.args, pm, source)

    def info(self) -> dict[str, Any]:
        """What the engine needs to set up the scheduler (plain values, sent as JSON)."""
        runner = self.runner
        return {
            "rank": self.rank,
            "pid": os.getpid(),
            "device": str(self.device),
            "num_blocks": int(runner.num_blocks),
            "block_size": int(runner.block_size),
            "max_model_len": int(runner.max_model_len),
            "vocab_size": int(runner.vocab_size),
            "weights_bytes": int(runner.weights_bytes),
        }

    def execute(self, scheduler_output: SchedulerOutput) -> ModelRunnerOutput:
        output: ModelRunnerOutput = self.runner.execute(scheduler_output)
        return output

    def close(self) -> None:
        import torch.distributed as dist

        if dist.is_initialized():
            dist.destroy_process_group()
