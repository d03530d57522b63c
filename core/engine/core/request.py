"""One request's state inside the engine core (token ids, progress, status)."""

from __future__ import annotations

import enum
import time
from dataclasses import dataclass, field
from typing import NewType

from engine.lora.request import LoRARequest
from engine.sampling_params import SamplingParams

ReqId = NewType("ReqId", str)


class RequestStatus(enum.Enum):
    WAITING = "waiting"
    RUNNING = "running"
    PREEMPTED = "preempted"
    FINISHED_STOPPED = "stop"
    FINISHED_LENGTH = "length"
    FINISHED_ABORTED = "abort"
    FINISHED_ERROR = "error"

    @property
    def is_finished(self) -> bool:
        return self.name.startswith("FINISHED")

    @property
    def finish_reason(self) -> str | None:
        """The OpenAI ``finish_reason`` string, or ``None`` while unfinished."""
        return self.value if self.is_finished else None


@dataclass
class Request:
    req_id: ReqId
    prompt_token_ids: list[int]
    sampling_params: SamplingParams
    priority: int = 0
    cache_salt: str | None = None
    lora_id: str | None = None  # adapter id: an extra key of the prefix-cache hash
    lora_request: LoRARequest | None = None  # the adapter it runs with (None: the base model)
    arrival_time: float = field(default_factory=time.monotonic)
    output_token_ids: list[int] = field(default_factory=list)
    num_computed_tokens: int = 0
    num_cached_tokens: int = 0  # prompt tokens served from the prefix cache (first schedule)
    num_preemptions: int = 0
    status: RequestStatus = RequestStatus.WAITING
    stop_reason: int | str | None = None  # the stop token id or stop string that ended it
    first_scheduled_time: float | None = None
    # Tokens sampled on the device whose values the host does not know yet (async
    # scheduling: the step that samples them is still running). At most one per step in
    # flight; the scheduler counts them as part of the sequence.
    num_output_placeholders: int = 0

    def __post_init__(self) -> None:
        if self.lora_request is not None and self.lora_id is None:
            self.lora_id = self.lora_request.cache_key

    @property
    def num_prompt_tokens(self) -> int:
        return len(self.prompt_token_ids)

    @property
    def num_tokens(self) -> int:
        return len(self.prompt_token_ids) + len(self.output_token_ids)

    @property
    def all_token_ids(self) -> list[int]:
        return self.prompt_token_ids + self.output_token_ids

    @property
    def is_finished(self) -> bool:
        return self.status.is_finished

    @property
    def needs_host_history(self) -> bool:
        """Whether sampling this request's next token needs its previous token on the host:
        penalties (token counts), ``min_tokens`` (output length) and structured outputs
        (the grammar state). The engine samples such a request's next token only after
        its previous step's result is applied."""
        params = self.sampling_params
        return (
            params.structured_outputs is not None
            or params.min_tokens > len(self.output_token_ids)
            or params.repetition_penalty != 1.0
            or params.presence_penalty != 0.0
            or params.frequency_penalty != 0.0
        )
