"""A compiled outlines-core index and the per-request matchers that walk it.

The index is shared read-only by every request with the same constraint. Each matcher
owns an outlines-core ``Guide`` (a cursor: one state id). The engine's per-step path does
not unpack masks: ``state_key`` is the guide's state id (the index's transitions from a
state are exactly its allowed tokens, so the id determines the mask) and ``fill_bitmask``
hands the engine outlines-core's packed bitmask as it is, for a state the engine has not
seen yet. ``accept_token`` advances the guide without a mask (outlines-core refuses a
token with no transition, which is a token the mask does not allow)::

    guide.write_mask_into -> uint32 words [ceil(V / 32)] -> unpackbits (little) -> bool [V]
                             bit (id % 32) of word (id // 32) is token id

``allowed_token_ids`` (the bool mask of the SDK contract) is built once per state from
those words and unpacked with numpy; the grammar keeps the masks of its most recently used
states. Masks handed out are shared: callers must not write to them.
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from typing import TYPE_CHECKING, Any, NamedTuple

import numpy as np
from engine_sdk.interfaces.structured_output import CompiledGrammar, GrammarMatcher

if TYPE_CHECKING:  # imported where masks are built: a compile worker never loads torch
    import torch

# Per-grammar mask cache: at most this many bytes of bool masks, and this many states.
MASK_CACHE_BYTES = 4 << 20
MAX_CACHED_STATES = 1024
# Per-grammar cache of whether a state is terminated (a bool per state, no mask).
MAX_TERMINAL_FLAGS = 1 << 16
# The in-memory index is about this many times its serialized (bincode) size.
INDEX_MEMORY_FACTOR = 2


class StateMask(NamedTuple):
    allowed: torch.Tensor  # bool [vocab_size]; shares memory with ``bits``
    bits: np.ndarray  # the same mask as numpy, for cheap single-token checks
    terminated: bool  # final state with no way to go on: only EOS is allowed


class OutlinesGrammar(CompiledGrammar):
    """One constraint compiled to an outlines-core ``Index`` for one vocabulary."""

    def __init__(self, index: Any, vocab_size: int, eos_token_id: int, regex: str) -> None:
        self.index = index
        self.regex = regex
        self.vocab_size = vocab_size
        self.eos_token_id = eos_token_id
        self._num_words = (vocab_size + 31) // 32
        self._max_states = max(4, min(MAX_CACHED_STATES, MASK_CACHE_BYTES // vocab_size))
        self._masks: OrderedDict[int, StateMask] = OrderedDict()
        self._terminal: dict[int, bool] = {}
        self._lock = threading.Lock()
        self._eos_only: StateMask | None = None
        serialized = index.__reduce__()[1][0]
        self.num_bytes = (
            INDEX_MEMORY_FACTOR * len(serialized) + self._max_states * vocab_size + len(regex)
        )

    def __getstate__(self) -> dict[str, Any]:
        """What crosses from a compile worker: the index and the sizes (the lock and the
        mask cache are rebuilt on the other side)."""
        return {
            "index": self.index, "regex": self.regex, "vocab_size": self.vocab_size,
            "eos_token_id": self.eos_token_id,
        }  # fmt: skip

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__init__(  # type: ignore[misc]
            state["index"], state["vocab_size"], state["eos_token_id"], state["regex"]
        )

    @property
    def eos_only(self) -> StateMask:
        """The mask after EOS: only EOS again (built on first use)."""
        if self._eos_only is None:
            import torch

            eos_only = np.zeros(self.vocab_size, dtype=np.bool_)
            eos_only[self.eos_token_id] = True
            self._eos_only = StateMask(torch.from_numpy(eos_only), eos_only, True)
        return self._eos_only

    def new_matcher(self) -> OutlinesMatcher:
        return OutlinesMatcher(self)

    def state_mask(self, guide: Any) -> StateMask:
        """The mask of the guide's current state, from the cache or built now."""
        state = guide.get_state()
        with self._lock:
            cached = self._masks.get(state)
            if cached is not None:
                self._masks.move_to_end(state)
                return cached
        mask = self._build_mask(guide, state)
        with self._lock:
            self._masks[state] = mask
            while len(self._masks) > self._max_states:
                self._masks.popitem(last=False)
        return mask

    def _build_mask(self, guide: Any, state: int) -> StateMask:
        words = np.zeros(self._num_words, dtype=np.uint32)
        guide.write_mask_into(words.ctypes.data, self._num_words, 4)
        bits = np.unpackbits(words.view(np.uint8), bitorder="little")[: self.vocab_size]
        bits = bits.view(np.bool_)
        terminated = bool(self.index.is_final_state(state)) and int(bits.sum()) == 1
        import torch

        return StateMask(torch.from_numpy(bits), bits, terminated)

    def is_terminated_state(self, guide: Any) -> bool:
        """Whether the guide's state is final with EOS as its only allowed token (a flag
        per state, cached; no mask is unpacked)."""
        state = guide.get_state()
        terminated = self._terminal.get(state)
        if terminated is None:
            terminated = False
            if self.index.is_final_state(state):
                words = np.zeros(self._num_words, dtype=np.uint32)
                guide.write_mask_into(words.ctypes.data, self._num_words, 4)
                terminated = int(np.unpackbits(words.view(np.uint8)).sum()) == 1
            with self._lock:
                if len(self._terminal) >= MAX_TERMINAL_FLAGS:
                    self._terminal.clear()
                self._terminal[state] = terminated
        return terminated

    def num_cached_states(self) -> int:
        return len(self._masks)


class OutlinesMatcher(GrammarMatcher):
    """One request's cursor in an ``OutlinesGrammar``; EOS ends it (never fed to outlines)."""

    def __init__(self, grammar: OutlinesGrammar) -> None:
        from outlines_core import Guide

        self.grammar = grammar
        self._guide = Guide(grammar.index, 0)
        self._ended = False

    def _mask(self) -> StateMask:
        return self.grammar.eos_only if self._ended else self.grammar.state_mask(self._guide)

    def allowed_token_ids(self) -> torch.Tensor:
        return self._mask().allowed

    def accept_token(self, token_id: int) -> bool:
        if self._ended or not 0 <= token_id < self.grammar.vocab_size:
            return False
        if token_id == self.grammar.eos_token_id:  # allowed exactly in final states
            if not self.grammar.index.is_final_state(self._guide.get_state()):
                return False
            self._ended = True
            return True
        try:
            self._guide.advance(token_id, False)
        except ValueError:  # no transition from this state: the mask does not allow it
            return False
        return True

    def is_terminated(self) -> bool:
        return self._ended or self.grammar.is_terminated_state(self._guide)

    def state_key(self) -> int:
        """The guide's state id; -1 once EOS was accepted (outlines-core ids are >= 0)."""
        return -1 if self._ended else int(self._guide.get_state())

    def fill_bitmask(self, out: torch.Tensor) -> bool:
        if out.numel() != self.grammar._num_words:
            return False
        if self._ended:  # EOS only (bit 31 does not fit a Python int into int32: numpy)
            words = out.numpy().view(np.uint32)
            words[:] = 0
            words[self.grammar.eos_token_id // 32] = 1 << (self.grammar.eos_token_id % 32)
            return True
        self._guide.write_mask_into(out.data_ptr(), out.numel(), 4)
        return True
