"""The reasoning parser contract: separate the think section from the answer."""

from __future__ import annotations

from abc import ABC, abstractmethod
from typing import Any, ClassVar

from engine_sdk.interfaces.messages import DeltaMessage


class ReasoningParser(ABC):
    """One instance per request. Text inside the think section is ``reasoning_content``."""

    #: The ``--reasoning-parser`` name (informational; the spec's ``name`` selects it).
    name: ClassVar[str] = ""
    #: True when the think markers are special tokens: the server then detokenizes with
    #: ``skip_special_tokens=False`` so the parser sees them.
    requires_special_tokens: ClassVar[bool] = False

    def __init__(self, tokenizer: Any = None) -> None:
        self.tokenizer = tokenizer

    @abstractmethod
    def extract_reasoning(self, model_output: str) -> tuple[str | None, str | None]:
        """Return ``(reasoning_content, content)`` for a complete output."""

    @abstractmethod
    def extract_reasoning_streaming(
        self, previous_text: str, current_text: str, delta_text: str
    ) -> DeltaMessage | None:
        """Return the delta for ``delta_text`` (reasoning, content or both), or ``None``."""

    @abstractmethod
    def is_reasoning_end(self, text: str) -> bool:
        """Whether the think section has ended in ``text`` (structured output starts after)."""

    def finish_streaming(self, current_text: str) -> DeltaMessage | None:
        """Flush anything held back when generation ends (default: nothing)."""
        return None
