"""The engine core loop: schedule, run the model, apply the results.

``EngineCore`` joins a ``Scheduler`` and anything with ``execute(SchedulerOutput) ->
ModelRunnerOutput`` (the model runner, or a fake in tests). It is synchronous and not
thread-safe; the front end drives it from one thread.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Protocol

from engine.core.outputs import EngineCoreOutput, SchedulerStats
from engine.core.request import ReqId, Request, RequestStatus
from engine.core.scheduler import Scheduler
from engine.core.scheduler_output import ModelRunnerOutput, SchedulerOutput


class ModelRunnerProtocol(Protocol):
    def execute(self, scheduler_output: SchedulerOutput) -> ModelRunnerOutput: ...


class EngineCore:
    def __init__(self, scheduler: Scheduler, runner: ModelRunnerProtocol) -> None:
        self.scheduler = scheduler
        self.runner = runner

    def add_request(self, request: Request) -> None:
        self.scheduler.add_request(request)

    def abort_requests(self, req_ids: ReqId | Iterable[ReqId]) -> None:
        self.scheduler.finish_requests(req_ids, RequestStatus.FINISHED_ABORTED)

    def finish_requests(self, req_ids: ReqId | Iterable[ReqId], status: RequestStatus) -> None:
        self.scheduler.finish_requests(req_ids, status)

    def step(self) -> list[EngineCoreOutput]:
        """One scheduling step; [] without calling the runner when nothing is scheduled."""
        scheduler_output = self.scheduler.schedule()
        if scheduler_output.is_empty:
            return []
        runner_output = self.runner.execute(scheduler_output)
        return self.scheduler.update_from_output(scheduler_output, runner_output)

    def has_unfinished_requests(self) -> bool:
        return self.scheduler.has_unfinished_requests()

    def stats(self) -> SchedulerStats:
        return self.scheduler.stats()
