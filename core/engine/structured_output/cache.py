"""A bounded, in-memory LRU cache of compiled grammars (never on disk).

Bounded twice: by entry count and by bytes, so a flood of unique schemas evicts old
grammars instead of growing memory. An entry's size is its key plus the grammar's
``num_bytes`` (an estimate the backend may provide; 0 when it does not). A grammar larger
than the whole byte budget is not cached at all.
"""

from __future__ import annotations

import hashlib
import threading
from collections import OrderedDict

from engine_sdk.interfaces.structured_output import CompiledGrammar

from engine.structured_output.keys import GrammarKey


def grammar_num_bytes(grammar: CompiledGrammar) -> int:
    value = getattr(grammar, "num_bytes", 0)
    value = value() if callable(value) else value
    return max(0, int(value or 0))


class GrammarCache:
    """Thread-safe LRU: ``get`` refreshes an entry, ``put`` evicts the least recent."""

    def __init__(self, max_entries: int, max_bytes: int) -> None:
        self.max_entries = max_entries
        self.max_bytes = max_bytes
        self._entries: OrderedDict[GrammarKey, tuple[CompiledGrammar, int]] = OrderedDict()
        self._num_bytes = 0
        self._lock = threading.Lock()
        self.num_hits = 0
        self.num_misses = 0
        self.num_evictions = 0

    def get(self, key: GrammarKey) -> CompiledGrammar | None:
        with self._lock:
            entry = self._entries.get(key)
            if entry is None:
                self.num_misses += 1
                return None
            self._entries.move_to_end(key)
            self.num_hits += 1
            return entry[0]

    def put(self, key: GrammarKey, grammar: CompiledGrammar) -> bool:
        """Insert (or refresh) ``key``; ``False`` when it can never fit the budget."""
        size = key.num_bytes() + grammar_num_bytes(grammar)
        if self.max_entries == 0 or size > self.max_bytes:
            return False
        with self._lock:
            old = self._entries.pop(key, None)
            if old is not None:
                self._num_bytes -= old[1]
            self._entries[key] = (grammar, size)
            self._num_bytes += size
            while len(self._entries) > self.max_entries or self._num_bytes > self.max_bytes:
                _, (_, evicted_size) = self._entries.popitem(last=False)
                self._num_bytes -= evicted_size
                self.num_evictions += 1
        return True

    def __len__(self) -> int:
        return len(self._entries)

    def __contains__(self, key: GrammarKey) -> bool:
        return key in self._entries

    @property
    def num_bytes(self) -> int:
        return self._num_bytes

    def clear(self) -> None:
        with self._lock:
            self._entries.clear()
            self._num_bytes = 0


class RefusedGrammars:
    """Constraints that failed to compile (invalid, over the deadline, or too large to
    cache), so a repeat is refused at once instead of compiling again: each grammar is
    compiled once. Bounded LRU keyed by a SHA-256 of the key, so a flood of distinct
    hostile specs costs at most ``max_entries`` small entries."""

    def __init__(self, max_entries: int = 4096) -> None:
        self.max_entries = max_entries
        self._reasons: OrderedDict[bytes, str] = OrderedDict()
        self._lock = threading.Lock()

    @staticmethod
    def _digest(key: GrammarKey) -> bytes:
        return hashlib.sha256(f"{key.kind}\0{key.canonical}".encode("utf-8", "replace")).digest()

    def add(self, key: GrammarKey, reason: str) -> None:
        with self._lock:
            digest = self._digest(key)
            self._reasons[digest] = reason
            self._reasons.move_to_end(digest)
            while len(self._reasons) > self.max_entries:
                self._reasons.popitem(last=False)

    def discard(self, key: GrammarKey) -> None:
        with self._lock:
            self._reasons.pop(self._digest(key), None)

    def get(self, key: GrammarKey) -> str | None:
        with self._lock:
            return self._reasons.get(self._digest(key))

    def __len__(self) -> int:
        return len(self._reasons)
