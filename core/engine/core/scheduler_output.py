"""What the scheduler hands the model runner for one step, and what comes back.

``SchedulerOutput`` is the only input of ``ModelRunner.execute``: which requests run, which
tokens of each to compute, where they sit (start position) and their block tables. The
runner returns one ``ModelRunnerOutput`` with a sampled token for every request whose
``sample`` flag is set (its prompt is fully computed this step or it is decoding).
"""

from __future__ import annotations

from dataclasses import dataclass, field

from engine.core.request import ReqId, Request
from engine.outputs import Logprobs

# A token id the host does not know yet: the previous step sampled it on the device and the
# runner takes it from there (async scheduling). Only a decode step's single input token
# can be one.
PLACEHOLDER_TOKEN_ID = -1


@dataclass
class ScheduledRequest:
    req_id: ReqId
    # The tokens computed this step (a prompt chunk or one decode token); a decode token
    # still on the device is PLACEHOLDER_TOKEN_ID.
    token_ids: list[int]
    start_position: int  # position of token_ids[0] == num_computed_tokens before the step
    block_ids: list[int]  # the request's whole block table
    sample: bool  # sample a token after this step (prompt complete)
    request: Request  # same-process reference: sampling params and output history

    @property
    def num_tokens(self) -> int:
        return len(self.token_ids)


@dataclass
class SchedulerOutput:
    scheduled: list[ScheduledRequest] = field(default_factory=list)
    num_scheduled_tokens: int = 0
    # Requests that ended (finished, aborted, preempted) since the last step: the runner
    # drops its per-request state (sampling generators, penalty counts) for them.
    finished_req_ids: set[ReqId] = field(default_factory=set)
    preempted_req_ids: set[ReqId] = field(default_factory=set)

    @property
    def is_empty(self) -> bool:
        return not self.scheduled


@dataclass
class ModelRunnerOutput:
    sampled_token_ids: dict[ReqId, int] = field(default_factory=dict)
    logprobs: dict[ReqId, Logprobs] = field(default_factory=dict)
    # Prompt logprobs computed this step, one entry per prompt position after the first
    # (position 0 has none), in order; a chunked prompt gets them over several steps.
    prompt_logprobs: dict[ReqId, list[Logprobs]] = field(default_factory=dict)
    # Pooling models: the pooled vector of each request whose prompt completed this step.
    pooled: dict[ReqId, list[float]] = field(default_factory=dict)
