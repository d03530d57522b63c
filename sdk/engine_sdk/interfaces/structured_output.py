"""The structured-output contract: compile a constraint, then mask tokens step by step."""

from __future__ import annotations

import typing
from abc import ABC, abstractmethod
from typing import Any, ClassVar

if typing.TYPE_CHECKING:  # annotations only: a grammar compile process need not load torch
    import torch


class GrammarMatcher(ABC):
    """Tracks one request's position in its grammar."""

    @abstractmethod
    def allowed_token_ids(self) -> torch.Tensor | None:
        """Bool mask [vocab_size] of tokens allowed next, or ``None`` for no constraint."""

    @abstractmethod
    def accept_token(self, token_id: int) -> bool:
        """Advance by one token; ``False`` if the token was not allowed."""

    @abstractmethod
    def is_terminated(self) -> bool:
        """Whether the grammar is complete (only EOS may follow)."""


class CompiledGrammar(ABC):
    """A constraint compiled once and shared by every request that asks for it.

    The engine compiles in worker processes and pickles the result back: a compiled
    grammar must pickle (drop locks and caches in ``__getstate__``)."""

    @abstractmethod
    def new_matcher(self) -> GrammarMatcher: ...


class StructuredOutputBackend(ABC):
    """Builds compiled grammars for one tokenizer.

    The engine builds the backend once, then pickles it once into each of its compile
    worker processes, where ``compile`` runs under a deadline and a memory cap: a backend
    must pickle, and may leave out what ``compile`` does not need (the tokenizer, say)."""

    name: ClassVar[str] = ""

    def __init__(self, tokenizer: Any, vocab_size: int) -> None:
        self.tokenizer = tokenizer
        self.vocab_size = vocab_size

    @abstractmethod
    def compile(self, kind: str, spec: Any) -> CompiledGrammar:
        """Compile ``kind`` in {json, regex, choice, grammar}; raise ValueError on bad input."""
