"""Turn the core's per-step outputs into ``RequestOutput`` records for callers.

Owns every live user request's ``ParentRequest``: detokenizes new tokens, finds stop
strings (and reports which core requests must be finished because of them), aggregates
n > 1 sequences, and measures the latencies that ``IterationStats`` carries.
"""

from __future__ import annotations

import time
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

from engine.outputs import RequestOutput
from engine.outputs_processing.parent_request import ParentRequest
from engine.outputs_processing.request_state import RequestState
from engine.outputs_processing.stats import IterationStats, RequestTiming
from engine.sampling_params import SamplingParams


@dataclass
class ProcessedOutputs:
    request_outputs: list[RequestOutput] = field(default_factory=list)
    # Core requests whose output hit a stop string: finish them with FINISHED_STOPPED.
    req_ids_to_finish: list[str] = field(default_factory=list)


class OutputProcessor:
    """The front end's registry of live requests and their incremental outputs."""

    def __init__(self, tokenizer: Any) -> None:
        self.tokenizer = tokenizer
        self._parents: dict[str, ParentRequest] = {}
        self._states: dict[str, tuple[ParentRequest, RequestState]] = {}

    def __contains__(self, request_id: str) -> bool:
        return request_id in self._parents

    def has_unfinished_requests(self) -> bool:
        return bool(self._parents)

    def get_num_unfinished_requests(self) -> int:
        return len(self._parents)

    def add_request(
        self,
        request_id: str,
        prompt: str | None,
        prompt_token_ids: list[int],
        core_requests: list[tuple[str, SamplingParams, Any]],
        arrival_time: float | None = None,
    ) -> None:
        """Register a user request and its core requests (req_id, params, Request)."""
        if request_id in self._parents:
            raise ValueError(f"request id {request_id!r} is already running; use a unique id")
        for req_id, _, _ in core_requests:
            if req_id in self._states:
                raise ValueError(f"request id {req_id!r} is already running; use a unique id")
        arrival = time.monotonic() if arrival_time is None else arrival_time
        children = [
            RequestState(
                req_id,
                i,
                prompt_token_ids,
                params,
                self.tokenizer,
                RequestTiming(getattr(core, "arrival_time", arrival)),
                core,
            )
            for i, (req_id, params, core) in enumerate(core_requests)
        ]
        parent = ParentRequest(request_id, prompt, prompt_token_ids, children)
        self._parents[request_id] = parent
        for child in children:
            self._states[child.req_id] = (parent, child)

    def core_req_ids(self, request_id: str) -> list[str]:
        """The unfinished core requests of a user request ([] if it is unknown)."""
        parent = self._parents.get(request_id)
        if parent is None:
            return []
        return [c.req_id for c in parent.children if not c.finished]

    def process_outputs(
        self, core_outputs: Iterable[Any], it_stats: IterationStats | None = None
    ) -> ProcessedOutputs:
        """Apply one step's EngineCoreOutputs; return updated RequestOutputs (input order)."""
        now = time.monotonic()
        result = ProcessedOutputs()
        to_finish = result.req_ids_to_finish
        itl = it_stats.inter_token_latencies if it_stats is not None else None
        states = self._states
        touched: dict[str, ParentRequest] = {}
        for out in core_outputs:
            entry = states.get(out.req_id)
            if entry is None:
                continue  # aborted by the caller while the step ran
            parent, state = entry
            if state.finish_reason is not None:
                continue
            is_first = state.timing.first_token_time is None
            if state.process(out, now, itl):
                to_finish.append(state.req_id)
            if it_stats is not None:
                self._record(it_stats, state, out, is_first)
            touched[parent.request_id] = parent
        request_outputs = result.request_outputs
        for parent in touched.values():
            if parent.final_only and not parent.finished:
                continue  # RequestOutputKind.FINAL_ONLY: one output, at the end
            request_output = parent.take_output()
            request_outputs.append(request_output)
            if request_output.finished:
                self._remove(parent)
        return result

    def _record(
        self, it_stats: IterationStats, state: RequestState, out: Any, is_first: bool
    ) -> None:
        num_new = len(out.new_token_ids) if out.new_token_ids else 0
        it_stats.num_generation_tokens += num_new
        if is_first and num_new:
            if state.index == 0:  # n > 1 sequences share one prompt: count it once
                it_stats.num_prompt_tokens += state.num_prompt_tokens
            assert state.timing.first_token_time is not None
            it_stats.time_to_first_tokens.append(
                state.timing.first_token_time - state.timing.arrival_time
            )
        if state.finish_reason is not None:
            it_stats.finished_requests.append(state.finished_stats())

    def abort_requests(
        self,
        request_ids: Iterable[str],
        it_stats: IterationStats | None = None,
        reason: str = "abort",
        error: str | None = None,
    ) -> tuple[list[RequestOutput], list[str]]:
        """Finish user requests without the core.

        Returns their final RequestOutputs and the core request ids the caller must abort.
        """
        now = time.monotonic()
        outputs: list[RequestOutput] = []
        core_ids: list[str] = []
        for request_id in request_ids:
            parent = self._parents.get(request_id)
            if parent is None:
                continue
            for child in parent.children:
                if not child.finished:
                    core_ids.append(child.req_id)
                    child.abort(now, reason, error)
                    if it_stats is not None:
                        it_stats.finished_requests.append(child.finished_stats())
            outputs.append(parent.take_output())
            self._remove(parent)
        return outputs, core_ids

    def request_id_of(self, req_id: str) -> str | None:
        """The user request id a core request belongs to."""
        entry = self._states.get(req_id)
        return entry[0].request_id if entry is not None else None

    def all_request_ids(self) -> list[str]:
        return list(self._parents)

    def _remove(self, parent: ParentRequest) -> None:
        self._parents.pop(parent.request_id, None)
        for child in parent.children:
            self._states.pop(child.req_id, None)
