"""The front end's view of one core request: its text, tokens, logprobs and timing.

Each engine step hands the state the request's new token ids; the state detokenizes them,
checks stop strings and remembers what changed since the last ``RequestOutput`` (the
streaming delta).
"""

from __future__ import annotations

from typing import Any

from engine.outputs import CompletionOutput, Logprobs
from engine.outputs_processing.stats import FinishedRequestStats, RequestTiming
from engine.sampling_params import RequestOutputKind, SamplingParams
from engine.tokenization.detokenizer import IncrementalDetokenizer
from engine.tokenization.stop_strings import StopStringChecker


def finish_reason_str(reason: Any) -> str | None:
    """Accept the core's finish reason as a string or a ``RequestStatus``."""
    if reason is None:
        return None
    if isinstance(reason, str):
        return reason
    value = getattr(reason, "finish_reason", None)
    if isinstance(value, str):
        return value
    return str(reason)


class RequestState:
    """One sequence (a core request): index ``index`` of its parent's n completions."""

    def __init__(
        self,
        req_id: str,
        index: int,
        prompt_token_ids: list[int],
        params: SamplingParams,
        tokenizer: Any,
        timing: RequestTiming,
        core_request: Any = None,
    ) -> None:
        self.req_id = req_id
        self.index = index
        self.params = params
        self.num_prompt_tokens = len(prompt_token_ids)
        self.timing = timing
        # Same-process reference to the core's Request, read for its first scheduled time.
        self.core_request = core_request
        self.stop_checker = StopStringChecker(params.stop, params.include_stop_str_in_output)
        # One output at the end and no stop string to look for: nothing reads the text
        # before the request finishes, so it is decoded once then (``defer``).
        defer = params.output_kind == RequestOutputKind.FINAL_ONLY and not self.stop_checker.active
        self.detokenizer = IncrementalDetokenizer(
            tokenizer,
            prompt_token_ids,
            skip_special_tokens=params.skip_special_tokens,
            defer=defer,
        )
        self._has_stops = self.stop_checker.active  # else the checker is bypassed
        self.token_ids: list[int] = []
        self.text = ""
        self.logprobs: list[Logprobs] | None = [] if params.logprobs is not None else None
        self.prompt_logprobs: list[Logprobs | None] | None = (
            [None] if params.prompt_logprobs is not None else None
        )
        self.num_cached_tokens = 0
        self.pooled: list[float] | None = None  # a pooling model's vector
        self.finish_reason: str | None = None
        self.stop_reason: int | str | None = None
        self.error: str | None = None
        self._delta_text = ""
        self._delta_token_ids: list[int] = []
        self._delta_logprobs: list[Logprobs] = []
        self.has_update = False

    @property
    def finished(self) -> bool:
        return self.finish_reason is not None

    def process(self, core_output: Any, now: float, itl: list[float] | None = None) -> bool:
        """Apply one EngineCoreOutput; append inter-token latency samples to ``itl``.

        Returns whether a stop string matched and the core must be told to finish this
        request. (Runs for every request every step: kept to plain attribute work.)
        """
        assert self.finish_reason is None, f"output for finished request {self.req_id}"
        self.has_update = True
        if core_output.num_cached_tokens:
            self.num_cached_tokens = int(core_output.num_cached_tokens)
        if getattr(core_output, "pooled", None) is not None:
            self.pooled = core_output.pooled
        timing = self.timing
        if timing.first_scheduled_time is None:
            timing.first_scheduled_time = getattr(core_output, "first_scheduled_time", None)
        if core_output.new_prompt_logprobs and self.prompt_logprobs is not None:
            self.prompt_logprobs.extend(core_output.new_prompt_logprobs)
        if self.logprobs is not None and core_output.new_logprobs is not None:
            self._add_logprobs(core_output.new_logprobs)
        new_token_ids = core_output.new_token_ids
        stop_checker = self.stop_checker
        if new_token_ids:
            if len(new_token_ids) == 1:
                new_ids = [int(new_token_ids[0])]
            else:
                new_ids = [int(t) for t in new_token_ids]
            if timing.first_token_time is None:
                timing.first_token_time = now
            elif itl is not None and timing.last_token_time is not None:
                itl.append((now - timing.last_token_time) / len(new_ids))
            timing.last_token_time = now
            self.token_ids.extend(new_ids)
            self._delta_token_ids.extend(new_ids)
            delta = self.detokenizer.update(new_ids)
            if delta:
                if self._has_stops:
                    delta = stop_checker.update(delta).delta_text
                self.text += delta
                self._delta_text += delta
        stop_string = stop_checker.stopped
        core_reason = core_output.finish_reason
        if core_reason is not None:
            core_reason = finish_reason_str(core_reason)
        if stop_string is not None:
            self._finish("stop", stop_string, now)
            return core_reason is None
        if core_reason is not None:
            self._flush()
            if stop_checker.stopped is not None:  # the flushed tail held a stop string
                self._finish("stop", stop_checker.stopped, now)
            else:
                self._finish(core_reason, core_output.stop_reason, now)
        return False

    def abort(self, now: float, reason: str = "abort", error: str | None = None) -> None:
        """Finish without the core (abort, engine error)."""
        if self.finished:
            return
        self.has_update = True
        self.error = error
        self._flush()
        self._finish(reason, None, now)

    def _add_logprobs(self, new_logprobs: Any) -> None:
        assert self.logprobs is not None
        items = new_logprobs if isinstance(new_logprobs, list) else [new_logprobs]
        self.logprobs.extend(items)
        self._delta_logprobs.extend(items)

    def _emit(self, delta: str) -> None:
        if not delta:
            return
        self.text += delta
        self._delta_text += delta

    def _flush(self) -> None:
        if self.stop_checker.stopped is not None:
            return
        tail = self.detokenizer.flush()
        if not self._has_stops:
            self._emit(tail)
            return
        if tail:
            self._emit(self.stop_checker.update(tail).delta_text)
        if self.stop_checker.stopped is None:
            self._emit(self.stop_checker.flush())

    def _finish(self, reason: str, stop_reason: int | str | None, now: float) -> None:
        self.finish_reason = reason
        self.stop_reason = stop_reason
        self.timing.finished_time = now

    def take_output(self) -> CompletionOutput:
        """This sequence's output: cumulative with the delta since the last call, or only
        the delta when the request asked for ``RequestOutputKind.DELTA`` (no copies)."""
        delta_text, delta_ids = self._delta_text, self._delta_token_ids
        logprobs = self.logprobs
        delta_lps = self._delta_logprobs if logprobs is not None else None
        if self.params.output_kind == RequestOutputKind.DELTA:
            out = CompletionOutput(
                self.index, delta_text, delta_ids, self.finish_reason, self.stop_reason,
                delta_lps, delta_text, delta_ids, delta_lps,
            )  # fmt: skip
        else:
            out = CompletionOutput(
                self.index, self.text, self.token_ids[:], self.finish_reason,
                self.stop_reason, logprobs[:] if logprobs is not None else None,
                delta_text, delta_ids, delta_lps,
            )  # fmt: skip
        if logprobs is not None:
            self._delta_logprobs = []
        self._delta_text = ""
        self._delta_token_ids = []
        self.has_update = False
        return out

    def finished_stats(self) -> FinishedRequestStats:
        t = self.timing
        if t.first_scheduled_time is None and self.core_request is not None:
            t.first_scheduled_time = getattr(self.core_request, "first_scheduled_time", None)
        end = t.finished_time if t.finished_time is not None else t.arrival_time
        num_gen = len(self.token_ids)
        ft, lt, fs = t.first_token_time, t.last_token_time, t.first_scheduled_time
        decode = (lt - ft) if ft is not None and lt is not None else None
        return FinishedRequestStats(
            req_id=self.req_id,
            finish_reason=self.finish_reason or "abort",
            num_prompt_tokens=self.num_prompt_tokens,
            num_generation_tokens=num_gen,
            num_cached_tokens=self.num_cached_tokens,
            e2e_latency=end - t.arrival_time,
            queue_time=(fs - t.arrival_time) if fs is not None else None,
            time_to_first_token=(ft - t.arrival_time) if ft is not None else None,
            prefill_time=(ft - fs) if ft is not None and fs is not None else None,
            decode_time=decode,
            mean_time_per_output_token=(
                decode / (num_gen - 1) if decode is not None and num_gen > 1 else None
            ),
        )
