"""The scheduler: which requests compute which tokens each step, and what their results mean.

There are no prefill and decode phases. Each step fills one token budget
(``max_num_batched_tokens``) under a sequence cap (``max_num_seqs``):

1. ``_schedule_running``: running requests in admission order, one token each when
   decoding or the next chunk of an unfinished prompt. When the KV pool is out of blocks
   the lowest-priority / latest request is preempted (``_preempt``): its blocks are freed
   and it is recomputed later (prompt + outputs so far), starting from its cached prefix.
2. ``_schedule_waiting``: then queued requests (FCFS or by priority), each starting from
   its prefix-cache hit; a prompt larger than the remaining budget gets a chunk of it
   (or waits, without chunked prefill). Skipped in a step that preempted.

``schedule`` advances each scheduled request's ``num_computed_tokens`` at once and counts
the token its step will sample as a placeholder (``Request.num_output_placeholders``), so
the next step can be scheduled while this one runs (async scheduling): a decode whose input
is still on the device carries ``PLACEHOLDER_TOKEN_ID``, and the runner takes the token
from its previous step's sampled ids. ``update_from_output`` applies what the runner
computed, in step order: caches newly full blocks, replaces placeholders by the sampled
tokens and checks the stop conditions. A request that finished (or was aborted) after a
later step was scheduled for it gets nothing from that step. Not thread-safe: one engine
loop drives it.

    step N scheduled   num_computed += n, placeholders 0 -> 1      (N runs on the device)
    step N+1 scheduled input = placeholder, placeholders 1 -> 2
    step N applied     token appended,      placeholders 2 -> 1
"""

from __future__ import annotations

import logging
import math
import time
from collections.abc import Iterable
from dataclasses import dataclass, field

from engine.core.kv_cache import KVCacheConfig, KVCacheManager
from engine.core.outputs import EngineCoreOutput, SchedulerStats
from engine.core.request import ReqId, Request, RequestStatus
from engine.core.request_queue import make_request_queue
from engine.core.request_tokens import token_slice
from engine.core.scheduler_config import SchedulerConfig
from engine.core.scheduler_output import (
    PLACEHOLDER_TOKEN_ID,
    Logprobs,
    ModelRunnerOutput,
    ScheduledRequest,
    SchedulerOutput,
)
from engine.core.stop_checker import check_stop
from engine.errors import QueueFullError, RequestValidationError

logger = logging.getLogger(__name__)

PREEMPTION_LOG_INTERVAL_S = 60.0


@dataclass
class _StepState:
    """What one ``schedule`` call has decided so far."""

    token_budget: int
    scheduled: dict[ReqId, ScheduledRequest] = field(default_factory=dict)
    num_preempted: int = 0


class Scheduler:
    def __init__(self, scheduler_config: SchedulerConfig, kv_cache_config: KVCacheConfig) -> None:
        self.config = scheduler_config
        self.kv_cache_config = kv_cache_config
        _check_pool_fits_one_sequence(scheduler_config, kv_cache_config)
        self.kv = KVCacheManager(kv_cache_config)
        self.requests: dict[ReqId, Request] = {}  # every unfinished request
        self.waiting = make_request_queue(scheduler_config.policy)
        self.running: list[Request] = []  # in admission order
        self.num_preemptions = 0
        self._num_queued_tokens = 0
        # Reported in the next non-empty SchedulerOutput, so the runner drops their state.
        self._finished_req_ids: set[ReqId] = set()
        self._preempted_req_ids: set[ReqId] = set()
        self._first_token_times: dict[ReqId, float] = {}
        # Prompt logprobs: [entries received in this compute pass, entries delivered]. A
        # preempted request recomputes its prompt; already delivered entries are not resent.
        self._prompt_logprobs_progress: dict[ReqId, list[int]] = {}
        self._last_preemption_log = -math.inf

    # -- requests in and out ------------------------------------------------------------------

    def add_request(self, request: Request) -> None:
        """Queue a new request; ``QueueFullError`` when a ``--max-num-queued-*`` bound is hit."""
        self._validate_new_request(request)
        self._check_queue_bounds(request)
        request.status = RequestStatus.WAITING
        self.requests[request.req_id] = request
        self.waiting.add(request)
        self._num_queued_tokens += request.num_tokens

    def _validate_new_request(self, request: Request) -> None:
        if request.req_id in self.requests:
            raise RequestValidationError(
                f"request id {request.req_id!r} is already in use; give every request a unique id"
            )
        if request.num_prompt_tokens == 0:
            raise RequestValidationError(f"request {request.req_id!r}: the prompt is empty")
        max_model_len = self.config.max_model_len
        if request.num_tokens >= max_model_len:
            raise RequestValidationError(
                f"request {request.req_id!r}: the prompt has {request.num_tokens} tokens but "
                f"--max-model-len is {max_model_len}, which must also fit at least one "
                f"generated token; shorten the prompt to at most {max_model_len - 1} tokens "
                "or raise --max-model-len"
            )

    def _check_queue_bounds(self, request: Request) -> None:
        max_reqs = self.config.max_num_queued_reqs
        if max_reqs is not None and len(self.waiting) >= max_reqs:
            raise QueueFullError(
                f"the waiting queue is full: {len(self.waiting)} requests queued, the bound set "
                f"by --max-num-queued-reqs ({max_reqs}); retry later or raise "
                "--max-num-queued-reqs"
            )
        max_tokens = self.config.max_num_queued_tokens
        if max_tokens is None:
            return
        if request.num_tokens > max_tokens:
            raise RequestValidationError(
                f"request {request.req_id!r}: its {request.num_tokens} prompt tokens exceed "
                f"--max-num-queued-tokens ({max_tokens}) on their own; shorten the prompt or "
                "raise --max-num-queued-tokens"
            )
        if self._num_queued_tokens + request.num_tokens > max_tokens:
            raise QueueFullError(
                f"the waiting queue is full: {self._num_queued_tokens} prompt tokens queued "
                f"plus {request.num_tokens} new would exceed --max-num-queued-tokens "
                f"({max_tokens}); retry later or raise --max-num-queued-tokens"
            )

    def finish_requests(self, req_ids: ReqId | Iterable[ReqId], status: RequestStatus) -> None:
        """End requests wherever they are (queued, running, mid-prefill) and free their
        blocks at once. Unknown or already finished ids are ignored (aborts race finishes)."""
        if not status.is_finished:
            raise ValueError(f"finish_requests needs a FINISHED_* status, got {status}")
        if isinstance(req_ids, str):
            req_ids = [req_ids]
        running_ids = set()
        for req_id in req_ids:
            request = self.requests.get(req_id)
            if request is None:
                continue
            if request.status == RequestStatus.RUNNING:
                running_ids.add(req_id)
            else:
                self._dequeue(request, remove=True)
            request.status = status
            self._release(request)
        if running_ids:
            self.running = [r for r in self.running if r.req_id not in running_ids]

    def has_unfinished_requests(self) -> bool:
        return bool(self.requests)

    def get_num_unfinished_requests(self) -> int:
        return len(self.requests)

    def abandon_open_steps(self) -> None:
        """Steps scheduled but never to be applied (the runner failed): forget what they
        were computing."""
        self.kv.abandon_open_steps()

    def needs_step_results(self) -> bool:
        """Whether a running request with a token still on the device needs that token on
        the host before its next token is sampled (penalties, ``min_tokens``, structured
        outputs): the engine then samples the next step after applying the one in flight."""
        return any(r.num_output_placeholders and r.needs_host_history for r in self.running)

    # -- one step -----------------------------------------------------------------------------

    def schedule(self) -> SchedulerOutput:
        state = _StepState(token_budget=self.config.max_num_batched_tokens)
        self.kv.begin_step()
        self._schedule_running(state)
        if state.num_preempted == 0:
            # A step that preempted is short of blocks: admitting more would thrash.
            self._schedule_waiting(state)
        scheduled = list(state.scheduled.values())
        output = SchedulerOutput(
            scheduled=scheduled,
            # The budget shrank by every scheduled request's tokens (and grew back by those
            # of a request unscheduled by preemption).
            num_scheduled_tokens=self.config.max_num_batched_tokens - state.token_budget,
        )
        if scheduled:
            # An empty output never reaches the runner, so its news waits for the next one.
            output.finished_req_ids, self._finished_req_ids = self._finished_req_ids, set()
            output.preempted_req_ids, self._preempted_req_ids = self._preempted_req_ids, set()
        else:
            self.kv.discard_step()
        return output

    def _schedule_running(self, state: _StepState) -> None:
        # Runs for every running request every step: locals instead of repeated lookups.
        running = self.running
        allocate_slots = self.kv.allocate_slots
        threshold = self.config.long_prefill_token_threshold
        i = 0
        max_model_len = self.config.max_model_len
        while i < len(running) and state.token_budget > 0:
            request = running[i]
            num_placeholders = request.num_output_placeholders
            num_tokens = (
                len(request.prompt_token_ids) + len(request.output_token_ids) + num_placeholders
            )
            if num_placeholders and _ends_with_placeholders(request, num_tokens, max_model_len):
                i += 1  # its step in flight reaches a length limit: nothing more to compute
                continue
            num_new_tokens = num_tokens - request.num_computed_tokens
            if 0 < threshold < num_new_tokens:
                num_new_tokens = threshold
            if num_new_tokens > state.token_budget:
                num_new_tokens = state.token_budget
            assert num_new_tokens > 0, f"running request {request.req_id} has nothing to compute"
            if allocate_slots(request, num_new_tokens) is not None:
                self._add_scheduled(state, request, num_new_tokens)
                i += 1
                continue
            index = self._allocate_or_preempt(request, i, num_new_tokens, state)
            if index is not None:
                self._add_scheduled(state, request, num_new_tokens)
                i = index + 1
            # else: the request preempted itself and the next one slid into index i.

    def _allocate_or_preempt(
        self, request: Request, index: int, num_new_tokens: int, state: _StepState
    ) -> int | None:
        """Allocate for ``running[index]``, preempting victims until it fits. Returns the
        request's index afterwards, or None if it was the victim itself. A victim already
        scheduled this step (priority policy: an earlier index) is unscheduled."""
        while self.kv.allocate_slots(request, num_new_tokens) is None:
            victim_index = self._pick_victim_index()
            victim = self.running.pop(victim_index)
            self._preempt(victim, state)
            if victim is request:
                return None
            if victim_index < index:
                index -= 1
        return index

    def _schedule_waiting(self, state: _StepState) -> None:
        deferred: list[Request] = []
        max_loras = self.config.max_loras
        active_loras = self._running_lora_ids() if max_loras else set()
        while state.token_budget > 0 and len(self.running) < self.config.max_num_seqs:
            request = self.waiting.peek()
            if request is None:
                break
            lora = request.lora_request
            if (
                lora is not None
                and lora.lora_int_id not in active_loras
                and len(active_loras) >= max_loras
            ):
                # --max-loras adapters are running: this one waits (the queue behind it
                # goes on; it is first in line once one of those adapters drains).
                deferred.append(self.waiting.pop())
                continue
            computed_blocks, num_cached_tokens = self.kv.get_computed_blocks(request)
            if self.kv.is_next_block_pending(request, len(computed_blocks)):
                # Another request computes this request's next prefix block in this very
                # step: wait one step and hit it in the cache instead of recomputing it.
                deferred.append(self.waiting.pop())
                continue
            num_new_tokens = self._cap_new_tokens(request.num_tokens - num_cached_tokens)
            if num_new_tokens > state.token_budget:
                if not self.config.enable_chunked_prefill:
                    break  # the whole prompt must fit one step; it waits (FCFS order kept)
                num_new_tokens = state.token_budget
            if self.kv.allocate_slots(request, num_new_tokens, computed_blocks) is None:
                break
            assert request.num_output_placeholders == 0, "a queued request has no step in flight"
            self._dequeue(request, remove=False)
            self._admit(request, num_cached_tokens)
            self._add_scheduled(state, request, num_new_tokens)
            if lora is not None:
                active_loras.add(lora.lora_int_id)
        for request in reversed(deferred):
            self.waiting.prepend(request)  # back at the front, in their order

    def _running_lora_ids(self) -> set[int]:
        return {r.lora_request.lora_int_id for r in self.running if r.lora_request is not None}

    def _cap_new_tokens(self, num_new_tokens: int) -> int:
        threshold = self.config.long_prefill_token_threshold
        return threshold if 0 < threshold < num_new_tokens else num_new_tokens

    def _admit(self, request: Request, num_cached_tokens: int) -> None:
        self.kv.record_prefix_cache_lookup(request, num_cached_tokens)
        progress = self._prompt_logprobs_progress.get(request.req_id)
        if progress is not None:
            # A resumed request computes its prompt again: a new pass of prompt logprobs
            # (reset here, not at preemption: a step in flight may still deliver entries
            # of the old pass).
            progress[0] = 0
        request.num_computed_tokens = num_cached_tokens
        request.status = RequestStatus.RUNNING
        if request.first_scheduled_time is None:
            request.first_scheduled_time = time.monotonic()
            request.num_cached_tokens = num_cached_tokens
        self.running.append(request)

    def _add_scheduled(self, state: _StepState, request: Request, num_new_tokens: int) -> None:
        kv = self.kv
        req_id = request.req_id
        start = request.num_computed_tokens
        end = start + num_new_tokens
        if end // kv.block_size > start // kv.block_size:  # the step fills a block
            kv.mark_pending(request, num_new_tokens)
        num_prompt_tokens = len(request.prompt_token_ids)
        outputs = request.output_token_ids
        num_known = num_prompt_tokens + len(outputs)
        if start >= num_prompt_tokens:  # decoding: the last output token(s)
            token_ids = outputs[start - num_prompt_tokens : end - num_prompt_tokens]
        else:
            token_ids = token_slice(request, start, end)
        if end > num_known:  # the input is the token the step in flight samples
            token_ids = token_ids + [PLACEHOLDER_TOKEN_ID] * (end - max(start, num_known))
        sample = end == num_known + request.num_output_placeholders
        request.num_computed_tokens = end
        if sample:
            request.num_output_placeholders += 1
        # The block table is the manager's own list, not a copy: it only grows by appends
        # while the request runs and is replaced, never edited, when it is freed, so it
        # stays a valid table for this step (the runner reads the blocks the step reaches).
        state.scheduled[req_id] = ScheduledRequest(
            req_id, token_ids, start, kv.get_block_ids(req_id), sample, request
        )
        state.token_budget -= num_new_tokens

    # -- preemption ---------------------------------------------------------------------------

    def _pick_victim_index(self) -> int:
        """FCFS: the latest admitted. Priority: the largest (priority, arrival) key."""
        if self.config.policy == "fcfs":
            return len(self.running) - 1
        return max(
            range(len(self.running)),
            key=lambda j: (self.running[j].priority, self.running[j].arrival_time),
        )

    def _preempt(self, request: Request, state: _StepState) -> None:
        """Free the request's blocks and queue it for recomputation (it is already out of
        ``running``). Its outputs stay: the recompute treats prompt + outputs as its prompt."""
        scheduled = state.scheduled.pop(request.req_id, None)
        if scheduled is not None:
            state.token_budget += scheduled.num_tokens
            if scheduled.sample:
                request.num_output_placeholders -= 1
        self.kv.free(request)
        request.status = RequestStatus.PREEMPTED
        request.num_computed_tokens = 0
        request.num_preemptions += 1
        self.waiting.prepend(request)
        self._num_queued_tokens += request.num_tokens
        self._preempted_req_ids.add(request.req_id)
        self.num_preemptions += 1
        state.num_preempted += 1
        self._log_preemption(request)

    def _log_preemption(self, request: Request) -> None:
        now = time.monotonic()
        if now - self._last_preemption_log < PREEMPTION_LOG_INTERVAL_S:
            return
        self._last_preemption_log = now
        logger.warning(
            "Request %s was preempted and will be recomputed: the KV cache is out of blocks "
            "(%d preemptions so far). To avoid it, give the KV cache more memory "
            "(--gpu-memory-utilization, --kv-cache-memory-bytes) or lower --max-num-seqs / "
            "--max-num-batched-tokens.",
            request.req_id,
            self.num_preemptions,
        )

    # -- results ------------------------------------------------------------------------------

    def update_from_output(
        self, scheduler_output: SchedulerOutput, runner_output: ModelRunnerOutput
    ) -> list[EngineCoreOutput]:
        """Apply one step's results; steps are applied in the order they were scheduled."""
        outputs = []
        any_finished = False
        now = time.monotonic()
        running = RequestStatus.RUNNING
        apply_step = self._apply_step
        for scheduled in scheduler_output.scheduled:
            request = scheduled.request
            if request.status is not running:
                if request.status is RequestStatus.PREEMPTED and scheduled.sample:
                    # Preempted while this step ran: its token is still valid.
                    output = self._apply_to_preempted(scheduled, runner_output, now)
                    if output is not None:
                        outputs.append(output)
                continue  # else finished or aborted since: nothing of this step counts
            output = apply_step(scheduled, runner_output, now)
            if output is not None:
                outputs.append(output)
            if request.status is not running:  # finished by a stop condition
                any_finished = True
                self._release(request)
        if any_finished:
            self.running = [r for r in self.running if r.status is running]
        self.kv.end_step()
        return outputs

    def _apply_to_preempted(
        self, scheduled: ScheduledRequest, runner_output: ModelRunnerOutput, now: float
    ) -> EngineCoreOutput | None:
        """A queued (preempted) request's token from a step scheduled before preemption."""
        request = scheduled.request
        num_tokens_before = request.num_tokens
        output = self._apply_step(scheduled, runner_output, now, cache=False)
        self._num_queued_tokens += request.num_tokens - num_tokens_before
        if request.status is not RequestStatus.PREEMPTED:  # finished: out of the queue
            self._dequeue(request, remove=True)
            self._release(request)
        return output

    def _apply_step(
        self,
        scheduled: ScheduledRequest,
        runner_output: ModelRunnerOutput,
        now: float,
        cache: bool = True,
    ) -> EngineCoreOutput | None:
        # Runs for every scheduled request every step: plain attribute work only.
        request = scheduled.request
        req_id = request.req_id
        if cache:
            # Blocks of this step's tokens are computed now (their ids are all known:
            # earlier steps were applied first).
            self.kv.cache_blocks(request, scheduled.start_position + len(scheduled.token_ids))
        new_prompt_logprobs = None
        if runner_output.prompt_logprobs:
            new_prompt_logprobs = self._take_prompt_logprobs(
                request, runner_output.prompt_logprobs.get(req_id)
            )
        new_token_ids: list[int] = []
        new_logprobs = None
        finished = False
        first_token_time = None
        if scheduled.sample:
            token_id = runner_output.sampled_token_ids.get(req_id)
            if token_id is None:
                raise RuntimeError(
                    f"the model runner returned no sampled token for request {req_id!r}, "
                    "which was scheduled with sample=True"
                )
            request.output_token_ids.append(token_id)
            request.num_output_placeholders -= 1
            new_token_ids = [token_id]
            if runner_output.logprobs:
                logprobs = runner_output.logprobs.get(req_id)
                new_logprobs = [logprobs] if logprobs is not None else None
            first_token_time = self._first_token_times.get(req_id)
            if first_token_time is None:
                first_token_time = self._first_token_times[req_id] = now
            finished = check_stop(request, self.config.max_model_len)
        elif new_prompt_logprobs is None:
            return None  # a prompt chunk that is not the last one
        else:
            first_token_time = self._first_token_times.get(req_id)
        return EngineCoreOutput(
            req_id,
            new_token_ids,
            new_logprobs,
            new_prompt_logprobs,
            request.status.value if finished else None,
            request.stop_reason,
            request.num_cached_tokens,
            request.arrival_time,
            request.first_scheduled_time,
            first_token_time,
            now,
            request.num_preemptions,
            runner_output.pooled.get(req_id) if runner_output.pooled else None,
        )

    def _take_prompt_logprobs(
        self, request: Request, entries: list[Logprobs] | None
    ) -> list[Logprobs] | None:
        """The entries not delivered before (a recomputed prompt yields them again).

        pass indices   [received ........ received + len(entries))
        deliver        [max(received, delivered) .. min(end, num_prompt_tokens - 1))
        """
        if entries is None:
            return None
        progress = self._prompt_logprobs_progress.setdefault(request.req_id, [0, 0])
        received, delivered = progress
        end = received + len(entries)
        first = max(received, delivered)
        last = min(end, request.num_prompt_tokens - 1)
        progress[0] = end
        if last <= first:
            return None
        progress[1] = last
        return entries[first - received : last - received]

    # -- bookkeeping --------------------------------------------------------------------------

    def _dequeue(self, request: Request, remove: bool) -> None:
        """Take a queued request out of the waiting queue (popping it from the front, or
        marking it removed from anywhere)."""
        if remove:
            self.waiting.remove(request)
        else:
            popped = self.waiting.pop()
            assert popped is request
        self._num_queued_tokens -= request.num_tokens

    def _release(self, request: Request) -> None:
        """A finished request: free its blocks and forget it."""
        req_id = request.req_id
        self.kv.free(request)
        self.kv.free_block_hashes(req_id)
        del self.requests[req_id]
        self._first_token_times.pop(req_id, None)
        self._prompt_logprobs_progress.pop(req_id, None)
        self._finished_req_ids.add(req_id)

    def stats(self) -> SchedulerStats:
        lora = self.config.max_loras > 0
        return SchedulerStats(
            num_running=len(self.running),
            num_waiting=len(self.waiting),
            kv_cache_usage=self.kv.usage,
            num_preemptions=self.num_preemptions,
            prefix_cache_queries=self.kv.prefix_cache_queries,
            prefix_cache_hits=self.kv.prefix_cache_hits,
            num_free_blocks=self.kv.num_free_blocks,
            num_total_blocks=self.kv.num_usable_blocks,
            max_loras=self.config.max_loras,
            running_lora_adapters=_adapter_names(self.running) if lora else (),
            waiting_lora_adapters=_adapter_names(self.waiting) if lora else (),
        )


def _adapter_names(requests: Iterable[Request]) -> tuple[str, ...]:
    names = {r.lora_request.lora_name for r in requests if r.lora_request is not None}
    return tuple(sorted(names))


def _ends_with_placeholders(request: Request, num_tokens: int, max_model_len: int) -> bool:
    """Whether the tokens in flight already reach ``max_tokens`` or the context length, so
    the request finishes when they are applied (a stop token can only end it sooner)."""
    max_tokens = request.sampling_params.max_tokens
    num_outputs = len(request.output_token_ids) + request.num_output_placeholders
    return (max_tokens is not None and num_outputs >= max_tokens) or num_tokens >= max_model_len


def _check_pool_fits_one_sequence(
    scheduler_config: SchedulerConfig, kv_cache_config: KVCacheConfig
) -> None:
    """A request alone must always fit, or preemption could never make progress."""
    capacity = kv_cache_config.num_usable_blocks * kv_cache_config.block_size
    if capacity < scheduler_config.max_model_len:
        raise ValueError(
            f"the KV cache holds {capacity} tokens ({kv_cache_config.num_usable_blocks} usable "
            f"blocks of {kv_cache_config.block_size}) but one sequence may reach --max-model-len "
            f"({scheduler_config.max_model_len}) tokens; lower --max-model-len to {capacity} or "
            "give the KV cache more memory (--gpu-memory-utilization, --kv-cache-memory-bytes)"
        )
