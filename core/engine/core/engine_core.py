"""The engine core loop: schedule, run the model, apply the results.

``EngineCore`` joins a ``Scheduler`` and anything with ``execute(SchedulerOutput) ->
ModelRunnerOutput`` (the model runner, or a fake in tests). It is not thread-safe; the
front end drives it from one thread.

With ``async_scheduling`` (the runner must offer ``execute_async``), one step stays in
flight: each ``step()`` schedules and launches step N+1 while step N runs on the device,
then waits for step N's tokens and applies them, so the host's scheduling, input building
and output processing overlap the device's work instead of alternating with it::

    host    | sched N+1 | launch N+1 | wait N | apply N | (caller: detokenize N) | sched N+2 ...
    device  | .......... step N .........|.............. step N+1 ......................

A step's sampled ids stay on the device as the next step's inputs. When a running request
needs its previous token on the host before sampling the next one (penalties,
``min_tokens``, structured outputs), the next step's forward pass is still launched at
once, but its sampling only after the step in flight is applied (``defer_sampling``): the
host applies step N and builds the masks while the device runs step N+1's forward::

    host    | sched N+1 | fwd N+1 | wait N | apply N | masks | sample N+1 | ...
    device  | .... step N ..........|..... fwd N+1 ..........|.. sample N+1 ..
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


class PendingRunnerOutput(Protocol):
    """A launched step; ``result()`` waits for it and returns its output (once)."""

    def launch_sampling(self) -> None:
        """Launch the sampling of a step launched with ``defer_sampling`` (no-op if done)."""

    def result(self) -> ModelRunnerOutput: ...


class AsyncModelRunner(ModelRunnerProtocol, Protocol):
    def execute_async(
        self, scheduler_output: SchedulerOutput, defer_sampling: bool = False
    ) -> PendingRunnerOutput: ...


class EngineCore:
    def __init__(
        self,
        scheduler: Scheduler,
        runner: ModelRunnerProtocol,
        async_runner: AsyncModelRunner | None = None,
    ) -> None:
        """``async_runner`` (the same runner, typed for ``execute_async``) turns on async
        scheduling; None keeps every step synchronous."""
        self.scheduler = scheduler
        self.runner = runner
        self.async_runner = async_runner
        self._in_flight: tuple[SchedulerOutput, PendingRunnerOutput] | None = None

    @property
    def async_scheduling(self) -> bool:
        return self.async_runner is not None

    def add_request(self, request: Request) -> None:
        self.scheduler.add_request(request)

    def abort_requests(self, req_ids: ReqId | Iterable[ReqId]) -> None:
        self.scheduler.finish_requests(req_ids, RequestStatus.FINISHED_ABORTED)

    def finish_requests(self, req_ids: ReqId | Iterable[ReqId], status: RequestStatus) -> None:
        self.scheduler.finish_requests(req_ids, status)

    def step(self) -> list[EngineCoreOutput]:
        """One scheduling step; [] without calling the runner when nothing is scheduled.

        Async scheduling: returns the outputs of the step launched by the previous call
        (and launches the next one)."""
        try:
            return self._step()
        except BaseException:
            # The failed steps are never applied: their prefix-cache pending marks must not
            # hold back requests that wait for those blocks. The caller fails the requests.
            self._in_flight = None
            self.scheduler.abandon_open_steps()
            raise

    def _step(self) -> list[EngineCoreOutput]:
        if self.async_runner is None:
            scheduler_output = self.scheduler.schedule()
            if scheduler_output.is_empty:
                return []
            runner_output = self.runner.execute(scheduler_output)
            return self.scheduler.update_from_output(scheduler_output, runner_output)
        outputs: list[EngineCoreOutput] = []
        defer = self._in_flight is not None and self.scheduler.needs_step_results()
        scheduler_output = self.scheduler.schedule()
        launched = None
        if not scheduler_output.is_empty:
            pending = self.async_runner.execute_async(scheduler_output, defer)
            launched = (scheduler_output, pending)
        if self._in_flight is not None:
            outputs = self._apply_in_flight()
        if launched is not None:
            launched[1].launch_sampling()
        self._in_flight = launched
        return outputs

    def _apply_in_flight(self) -> list[EngineCoreOutput]:
        assert self._in_flight is not None
        scheduler_output, pending = self._in_flight
        self._in_flight = None
        return self.scheduler.update_from_output(scheduler_output, pending.result())

    def has_unfinished_requests(self) -> bool:
        # A request waiting for its step in flight is unfinished; a step in flight whose
        # requests all finished since has nothing left to deliver.
        return self.scheduler.has_unfinished_requests()

    def stats(self) -> SchedulerStats:
        return self.scheduler.stats()
