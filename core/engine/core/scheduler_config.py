"""Settings of the scheduler (``SchedulerConfig``), validated with the flag names to change."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from engine.config import EngineArgs

POLICIES = ("fcfs", "priority")


@dataclass(frozen=True)
class SchedulerConfig:
    max_num_seqs: int
    max_num_batched_tokens: int
    max_model_len: int
    enable_chunked_prefill: bool = True
    long_prefill_token_threshold: int = 0  # 0: off
    policy: str = "fcfs"  # fcfs | priority (lower ``priority`` value first)
    max_num_queued_reqs: int | None = None
    max_num_queued_tokens: int | None = None
    max_loras: int = 0  # distinct adapters among running requests (0: LoRA off)

    def __post_init__(self) -> None:
        def at_least(flag: str, value: int, minimum: int) -> None:
            if value < minimum:
                raise ValueError(f"--{flag} must be at least {minimum}, got {value}")

        at_least("max-num-seqs", self.max_num_seqs, 1)
        at_least("max-num-batched-tokens", self.max_num_batched_tokens, 1)
        at_least("max-model-len", self.max_model_len, 2)
        at_least("long-prefill-token-threshold", self.long_prefill_token_threshold, 0)
        if self.max_num_queued_reqs is not None:
            at_least("max-num-queued-reqs", self.max_num_queued_reqs, 1)
        if self.max_num_queued_tokens is not None:
            at_least("max-num-queued-tokens", self.max_num_queued_tokens, 1)
        if self.policy not in POLICIES:
            raise ValueError(
                f"--scheduling-policy must be one of {', '.join(POLICIES)}; got {self.policy!r}"
            )
        if not self.enable_chunked_prefill:
            if self.max_num_batched_tokens < self.max_model_len:
                raise ValueError(
                    f"without chunked prefill a whole prompt must fit one step, but "
                    f"--max-num-batched-tokens ({self.max_num_batched_tokens}) is smaller "
                    f"than --max-model-len ({self.max_model_len}); raise "
                    f"--max-num-batched-tokens to {self.max_model_len}, lower --max-model-len, "
                    "or pass --enable-chunked-prefill"
                )
            if self.long_prefill_token_threshold:
                raise ValueError(
                    "--long-prefill-token-threshold splits prompts, which needs chunked "
                    "prefill: pass --enable-chunked-prefill or set the threshold to 0"
                )

    @classmethod
    def from_engine_args(cls, args: EngineArgs, max_model_len: int) -> SchedulerConfig:
        """``max_model_len`` is the resolved one (the runner's), not ``args.max_model_len``."""
        return cls(
            max_num_seqs=args.max_num_seqs,
            max_num_batched_tokens=args.effective_max_num_batched_tokens(),
            max_model_len=max_model_len,
            enable_chunked_prefill=args.enable_chunked_prefill,
            long_prefill_token_threshold=args.long_prefill_token_threshold,
            policy=args.scheduling_policy,
            max_num_queued_reqs=args.max_num_queued_reqs,
            max_num_queued_tokens=args.max_num_queued_tokens,
            max_loras=args.max_loras if args.enable_lora else 0,
        )
