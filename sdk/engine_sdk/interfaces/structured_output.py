"""The structured-output contract: compile a constraint, then mask tokens step by step."""

from __future__ import annotations

import typing
from abc import ABC, abstractmethod
from collections.abc import Hashable
from typing import Any, ClassVar

if typing.TYPE_CHECKING:  # annotations only: a grammar compile process need not load torch
    import torch


class GrammarMatcher(ABC):
    """Tracks one request's position in its grammar.

    The three abstract methods are the whole contract. Two optional methods make the
    per-step masks cheap at large batches (the engine checks both against the abstract
    ones: ``engine_sdk.testing.structured_output``):

    - ``state_key``: names the state, so the engine builds a state's mask once and reuses
      it for every request of the same compiled grammar in that state;
    - ``fill_bitmask``: writes the allowed ids as packed bits, so building a mask does not
      go through a bool tensor of ``vocab_size``.
    """

    @abstractmethod
    def allowed_token_ids(self) -> torch.Tensor | None:
        """Bool mask [vocab_size] of tokens allowed next, or ``None`` for no constraint."""

    @abstractmethod
    def accept_token(self, token_id: int) -> bool:
        """Advance by one token; ``False`` if the token was not allowed."""

    @abstractmethod
    def is_terminated(self) -> bool:
        """Whether the grammar is complete (only EOS may follow)."""

    def state_key(self) -> Hashable | None:
        """A value naming the current state within this matcher's ``CompiledGrammar``,
        or ``None`` (the default): no key, the engine builds this row's mask every step.

        Exactness is the contract: two matchers of the same compiled grammar whose keys
        are equal must give equal ``allowed_token_ids()`` and ``is_terminated()``. Keys
        need not be unique across grammars (the engine adds the grammar's identity), and
        a key must change whenever the mask may change (a state id, plus a flag for
        anything else the mask depends on)."""
        return None

    def fill_bitmask(self, out: torch.Tensor) -> bool:
        """Write ``allowed_token_ids()`` as packed bits into ``out`` and return ``True``;
        return ``False`` (the default) to leave it to the engine, which then packs
        ``allowed_token_ids()`` itself (do so where that mask would be ``None``).

        ``out``: a zeroed, contiguous CPU ``int32`` tensor of ``ceil(vocab_size / 32)``
        words, ``vocab_size`` being the backend's; bit ``id % 32`` of word ``id // 32`` is
        token ``id`` (on a little-endian host: byte ``id // 8``, bit ``id % 8``). The
        engine calls it only when ``is_terminated()`` is false."""
        return False


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
