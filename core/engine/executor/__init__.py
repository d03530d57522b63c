"""Executors: what runs the model for the engine core, in this process or in workers.

``build_executor`` returns the plain ``ModelRunner`` for ``--tensor-parallel-size 1`` (no
extra layer, no extra process) and a ``MultiprocExecutor`` with one worker process per
rank otherwise. Both have ``execute(SchedulerOutput) -> ModelRunnerOutput`` and the
``num_blocks``, ``block_size``, ``max_model_len`` and ``vocab_size`` the engine reads.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Protocol

from engine.config import EngineArgs
from engine.core.scheduler_output import ModelRunnerOutput, SchedulerOutput

if TYPE_CHECKING:
    from engine.plugins import PluginManager

__all__ = ["Executor", "build_executor"]


class Executor(Protocol):
    """What the engine needs from whatever runs the model (``ModelRunner`` conforms)."""

    num_blocks: int
    block_size: int
    max_model_len: int
    vocab_size: int

    def execute(self, scheduler_output: SchedulerOutput) -> ModelRunnerOutput: ...


def build_executor(args: EngineArgs, pm: PluginManager, source: Any) -> Executor:
    """The runner of ``args``: in-process for one rank, worker processes for more."""
    from engine.executor.validation import check_tensor_parallel

    check_tensor_parallel(args, pm, source.hf_config)
    if args.tensor_parallel_size == 1:
        from engine.model_executor.runner import ModelRunner

        return ModelRunner(args, pm, source)
    from engine.executor.multiproc import MultiprocExecutor

    return MultiprocExecutor(args, pm, source)
