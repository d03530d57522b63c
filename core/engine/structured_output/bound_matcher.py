"""``BoundMatcher``: a backend's matcher together with the identity of its compiled grammar.

A backend's ``state_key`` names a state within one compiled grammar only: two schemas both
have a state 7, with different masks. The manager hands out matchers bound to a serial
number of their grammar, unique in this process and never reused (a grammar evicted from
the compile cache and compiled again gets a new one), so ``(serial, backend key)`` names
one mask exactly and the mask table (``mask_table.py``) can share rows across requests.
"""

from __future__ import annotations

import itertools
import weakref
from collections.abc import Hashable
from typing import TYPE_CHECKING, Any

from engine_sdk.interfaces.structured_output import CompiledGrammar, GrammarMatcher

if TYPE_CHECKING:
    import torch


class BoundMatcher(GrammarMatcher):
    """Delegates to ``inner``; ``state_key`` is ``(grammar_serial, inner.state_key())``, or
    ``None`` when either part is missing (then the row is built every step)."""

    def __init__(self, inner: GrammarMatcher, grammar_serial: int | None) -> None:
        self.inner = inner
        self.grammar_serial = grammar_serial

    def allowed_token_ids(self) -> torch.Tensor | None:
        return self.inner.allowed_token_ids()

    def accept_token(self, token_id: int) -> bool:
        return self.inner.accept_token(token_id)

    def is_terminated(self) -> bool:
        return self.inner.is_terminated()

    def state_key(self) -> Hashable | None:
        if self.grammar_serial is None:
            return None
        key = self.inner.state_key()
        return None if key is None else (self.grammar_serial, key)

    def fill_bitmask(self, out: torch.Tensor) -> bool:
        return self.inner.fill_bitmask(out)


class GrammarSerials:
    """A serial number per live compiled grammar, by object identity (never by ``==``:
    a plugin's grammar may compare by value)."""

    def __init__(self) -> None:
        self._counter = itertools.count()
        self._serials: dict[int, tuple[weakref.ref[Any], int]] = {}

    def __len__(self) -> int:
        return len(self._serials)

    def serial(self, grammar: CompiledGrammar) -> int | None:
        """The grammar's serial; ``None`` for an object that takes no weak reference (its
        identity could not be told from a later object at the same address)."""
        key = id(grammar)
        entry = self._serials.get(key)
        if entry is not None and entry[0]() is grammar:
            return entry[1]
        try:
            ref = weakref.ref(grammar, lambda dead: self._forget(key, dead))
        except TypeError:
            return None
        serial = next(self._counter)
        self._serials[key] = (ref, serial)
        return serial

    def _forget(self, key: int, dead: weakref.ref[Any]) -> None:
        entry = self._serials.get(key)
        if entry is not None and entry[0] is dead:
            del self._serials[key]

    def bind(self, grammar: CompiledGrammar) -> BoundMatcher:
        """A new matcher of ``grammar``, bound to its serial."""
        return BoundMatcher(grammar.new_matcher(), self.serial(grammar))
