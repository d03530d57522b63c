"""Per-request sampling settings (offline ``SamplingParams`` and the server's fields).

No torch here: the API layer builds these for every request. ``validate`` raises
``RequestValidationError`` (a ``ValueError``) whose message names the field and the allowed
range and whose ``param`` is the field; the HTTP layer turns that into a 400.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field, fields, replace
from enum import IntEnum
from typing import Any

from engine.errors import RequestValidationError

_GREEDY_EPS = 1e-5


class RequestOutputKind(IntEnum):
    """What each ``RequestOutput`` of a request holds (vLLM's names and values).

    - ``CUMULATIVE``: everything so far in ``text``/``token_ids``/``logprobs``, plus the
      ``delta_*`` fields since the last output (the default; direct ``generate`` callers);
    - ``DELTA``: only what is new: ``text``, ``token_ids`` and ``logprobs`` *are* the
      delta (the API server streams these; nothing is copied or re-joined per step);
    - ``FINAL_ONLY``: one output, when the request finishes (the offline ``LLM``).
    """

    CUMULATIVE = 0
    DELTA = 1
    FINAL_ONLY = 2


@dataclass
class StructuredOutputsParams:
    """Exactly one constraint: ``json`` (a JSON Schema, dict or string), ``regex``,
    ``choice`` (list of strings), ``grammar`` (EBNF/Lark text) or ``json_object``."""

    json: dict[str, Any] | str | None = None
    regex: str | None = None
    choice: list[str] | None = None
    grammar: str | None = None
    json_object: bool | None = None

    def kind_and_spec(self) -> tuple[str, Any]:
        set_fields = [(f.name, getattr(self, f.name)) for f in fields(self)]
        chosen = [(k, v) for k, v in set_fields if v not in (None, False)]
        if len(chosen) != 1:
            names = ", ".join(f.name for f in fields(self))
            raise RequestValidationError(
                f"structured_outputs needs exactly one of {names}; got {len(chosen)}",
                "structured_outputs",
            )
        return chosen[0]


@dataclass
class SamplingParams:
    n: int = 1
    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = 0  # 0 or -1: off
    min_p: float = 0.0
    seed: int | None = None
    presence_penalty: float = 0.0
    frequency_penalty: float = 0.0
    repetition_penalty: float = 1.0
    max_tokens: int | None = 16
    min_tokens: int = 0
    stop: list[str] = field(default_factory=list)
    stop_token_ids: list[int] = field(default_factory=list)
    ignore_eos: bool = False
    include_stop_str_in_output: bool = False
    logprobs: int | None = None
    prompt_logprobs: int | None = None
    skip_special_tokens: bool = True
    structured_outputs: StructuredOutputsParams | None = None
    # Token id -> value added to its logit before penalties and masks (OpenAI's logit_bias).
    logit_bias: dict[int, float] | None = None
    # Filled by the engine, not by users: EOS ids from the tokenizer / generation config.
    eos_token_ids: list[int] = field(default_factory=list)
    output_kind: RequestOutputKind = RequestOutputKind.CUMULATIVE

    def __post_init__(self) -> None:
        if isinstance(self.stop, str):
            self.stop = [self.stop]
        if self.top_k == -1:
            self.top_k = 0

    @property
    def greedy(self) -> bool:
        return self.temperature < _GREEDY_EPS

    def clone(self, **changes: Any) -> SamplingParams:
        return replace(self, **changes)

    def validate(self, max_logprobs: int = 20) -> None:
        """Raise ``RequestValidationError`` (a ``ValueError``) for the first field out of
        range: the message starts with the field's name, and ``param`` is that name."""

        def finite(name: str, value: float) -> None:
            if not math.isfinite(value):
                raise RequestValidationError(f"{name} must be a finite number, got {value}", name)

        for name in (
            "temperature",
            "top_p",
            "min_p",
            "presence_penalty",
            "frequency_penalty",
            "repetition_penalty",
        ):
            finite(name, float(getattr(self, name)))
        if self.n < 1:
            raise RequestValidationError(f"n must be at least 1, got {self.n}", "n")
        if self.temperature < 0:
            raise RequestValidationError(
                f"temperature must be >= 0, got {self.temperature}", "temperature"
            )
        if not 0 < self.top_p <= 1:
            raise RequestValidationError(f"top_p must be in (0, 1], got {self.top_p}", "top_p")
        if self.top_k < 0:
            raise RequestValidationError(
                f"top_k must be -1 (off), 0 (off) or positive, got {self.top_k}", "top_k"
            )
        if not 0 <= self.min_p <= 1:
            raise RequestValidationError(f"min_p must be in [0, 1], got {self.min_p}", "min_p")
        for name in ("presence_penalty", "frequency_penalty"):
            if not -2 <= getattr(self, name) <= 2:
                raise RequestValidationError(
                    f"{name} must be in [-2, 2], got {getattr(self, name)}", name
                )
        if not 0 < self.repetition_penalty <= 2:
            raise RequestValidationError(
                f"repetition_penalty must be in (0, 2], got {self.repetition_penalty}",
                "repetition_penalty",
            )
        if self.max_tokens is not None and self.max_tokens < 1:
            raise RequestValidationError(
                f"max_tokens must be at least 1, got {self.max_tokens}", "max_tokens"
            )
        if self.min_tokens < 0:
            raise RequestValidationError(
                f"min_tokens must be >= 0, got {self.min_tokens}", "min_tokens"
            )
        if self.max_tokens is not None and self.min_tokens > self.max_tokens:
            raise RequestValidationError(
                f"min_tokens ({self.min_tokens}) must not exceed max_tokens ({self.max_tokens})",
                "min_tokens",
            )
        for name in ("logprobs", "prompt_logprobs"):
            value = getattr(self, name)
            if value is not None and not 0 <= value <= max_logprobs:
                raise RequestValidationError(
                    f"{name} must be in [0, {max_logprobs}], got {value}", name
                )
        if any(not s for s in self.stop):
            raise RequestValidationError("stop strings must not be empty", "stop")
        if self.structured_outputs is not None:
            self.structured_outputs.kind_and_spec()
        for token_id, bias in (self.logit_bias or {}).items():
            if not (math.isfinite(bias) and -100 <= bias <= 100):
                raise RequestValidationError(
                    f"logit_bias values must be in [-100, 100], got {bias} for {token_id}",
                    "logit_bias",
                )
            if token_id < 0:
                raise RequestValidationError(
                    f"logit_bias keys must be token ids >= 0, got {token_id}", "logit_bias"
                )
