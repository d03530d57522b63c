"""``PackedMaskTable``: the widened mask of each grammar state, built once, kept as packed
bits in one table on the device, shared by every request in that state.

A step looks up each constrained row's ``state_key`` (exact: the grammar's serial and the
backend's state, see ``bound_matcher.py``) and gets a table row; only states not in the
table are built on the host (the backend's packed bitmask, or its bool mask packed here,
then the EOS rules) and copied in, all of a step's new rows in one copy. The sampler then
gathers the step's rows from the table and unpacks them on the device::

    host:    matcher -> state_key -> slot      (a dict lookup; misses: build, stage)
    device:  table[slots] -> uint8 [rows, num_bytes] -> forbidden bool [rows, V] -> -inf

    table    slot 0: all bits set (unconstrained rows)
             slot s: bit (id % 8) of byte (id // 8) = token id allowed in that state

Rows are reused least recently used first past ``max_rows`` (``num_bytes`` of device
memory each: 18,992 for a 151,936-token vocabulary), except rows the current step uses: a
step with more distinct states than ``max_rows`` grows the table instead. A matcher
without a key (a backend without ``state_key``, or a matcher the manager did not bind)
gets a fresh row every step, built from its mask, never looked up again.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Hashable, Sequence

import numpy as np
import torch
from engine_sdk.interfaces.structured_output import GrammarMatcher

from engine.model_executor.device_tensors import host_tensor, to_device
from engine.structured_output.bound_matcher import BoundMatcher
from engine.structured_output.masks import EosRules, PackedMasks, forbidden_bits_table

ALL_ALLOWED = 0  # the slot of the unconstrained row
MAX_ROWS = 1024  # about 19 MiB of device memory for a 151,936-token vocabulary
INITIAL_ROWS = 64


class _Unkeyed:
    """The key of a row built for one step only (never equal to another key)."""

    __slots__ = ()


class PackedMaskTable:
    """Packed widened masks on ``device`` for logits of ``vocab_size`` ids, built from
    matchers over a backend vocabulary of ``backend_vocab_size`` ids."""

    def __init__(
        self,
        rules: EosRules,
        device: torch.device,
        vocab_size: int,
        backend_vocab_size: int,
        max_rows: int = MAX_ROWS,
    ) -> None:
        self.rules = rules
        self.device = device
        self.vocab_size = vocab_size
        self.backend_vocab_size = backend_vocab_size
        self.max_rows = max(2, max_rows)
        self.num_bytes = 4 * -(-vocab_size // 32)  # whole int32 words: a backend's layout
        self._num_words = -(-backend_vocab_size // 32)
        # Ids of the backend's mask that the logits have (the rest are forbidden).
        self._num_ids = min(vocab_size, backend_vocab_size)
        self.table = torch.zeros(
            (min(INITIAL_ROWS, self.max_rows), self.num_bytes), dtype=torch.uint8, device=device
        )
        self.table[ALL_ALLOWED] = 0xFF
        self.lut = forbidden_bits_table(device)
        self._slots: OrderedDict[Hashable, int] = OrderedDict()  # least recently used first
        self._slot_step: list[int] = [0] * self.table.shape[0]
        self._free = list(range(self.table.shape[0] - 1, ALL_ALLOWED, -1))
        self._step = 0
        self.num_builds = 0  # rows built on the host (misses), for tests and benchmarks

    def __len__(self) -> int:
        """Rows held for a key (the unconstrained row not counted)."""
        return len(self._slots)

    @property
    def capacity(self) -> int:
        return int(self.table.shape[0])

    def lookup(self, matchers: Sequence[GrammarMatcher | None]) -> PackedMasks:
        """The step's masks, one row per matcher (``None``: unconstrained)."""
        self._step += 1
        step = self._step
        slots = [ALL_ALLOWED] * len(matchers)
        new_slots: list[int] = []
        new_rows: list[np.ndarray] = []
        for i, matcher in enumerate(matchers):
            if matcher is None:
                continue
            key = matcher.state_key() if type(matcher) is BoundMatcher else None
            if key is not None:
                slot = self._slots.get(key)
                if slot is not None:
                    self._slots.move_to_end(key)
                    self._slot_step[slot] = step
                    slots[i] = slot
                    continue
            row = self._build_row(matcher)
            if row is None:  # the backend says: no constraint for this row
                continue
            slot = self._allocate(_Unkeyed() if key is None else key)
            slots[i] = slot
            new_slots.append(slot)
            new_rows.append(row)
        if new_rows:
            self._store(new_slots, new_rows)
        index = host_tensor(slots, torch.long, self.device)
        return PackedMasks(self.table.index_select(0, index), self.lut, self.vocab_size)

    # -- building a row (host) ----------------------------------------------------------

    def _build_row(self, matcher: GrammarMatcher) -> np.ndarray | None:
        """The widened mask of ``matcher``'s state, packed; ``None``: unconstrained."""
        row = np.zeros(self.num_bytes, dtype=np.uint8)
        if matcher.is_terminated():
            self.num_builds += 1
            return self.rules.eos_only_bits(row, self.vocab_size)
        words = torch.zeros(self._num_words, dtype=torch.int32)
        if matcher.fill_bitmask(words):
            # uint32 words, bit (id % 32) of word (id // 32): as bytes on a little-endian
            # layout, bit (id % 8) of byte (id // 8).
            packed = words.numpy().astype("<i4", copy=False).view(np.uint8)
            num_ids = self._num_ids
        else:
            mask = matcher.allowed_token_ids()
            if mask is None:
                return None
            ids = mask[: self.vocab_size].cpu().numpy().astype(np.bool_, copy=False)
            packed = np.packbits(ids, bitorder="little")  # padded with 0 bits
            num_ids = len(ids)
        num_bytes = min(len(packed), self.num_bytes)
        row[:num_bytes] = packed[:num_bytes]
        _clear_from(row, num_ids)
        self.num_builds += 1
        return self.rules.widen_bits(row, self.vocab_size)

    # -- table rows ---------------------------------------------------------------------

    def _allocate(self, key: Hashable) -> int:
        """A row for ``key``: a free one, else the least recently used one not used this
        step, else a new one (the table grows)."""
        if not self._free and self.capacity < self.max_rows:
            self._grow(min(self.max_rows, 2 * self.capacity))
        if not self._free:
            oldest_key = next(iter(self._slots), None)
            if oldest_key is not None and self._slot_step[self._slots[oldest_key]] != self._step:
                self._free.append(self._slots.pop(oldest_key))
            else:
                self._grow(2 * self.capacity)
        slot = self._free.pop()
        self._slots[key] = slot
        self._slot_step[slot] = self._step
        return slot

    def _grow(self, capacity: int) -> None:
        old = self.table
        self.table = torch.zeros((capacity, self.num_bytes), dtype=torch.uint8, device=self.device)
        self.table[: old.shape[0]].copy_(old)
        self._slot_step.extend([0] * (capacity - old.shape[0]))
        self._free.extend(range(capacity - 1, old.shape[0] - 1, -1))

    def _store(self, slots: list[int], rows: list[np.ndarray]) -> None:
        """Copy the step's new rows into the table: one host-to-device copy."""
        staged = to_device(torch.from_numpy(np.stack(rows)), self.device)
        self.table.index_copy_(0, host_tensor(slots, torch.long, self.device), staged)


def _clear_from(row: np.ndarray, first_id: int) -> None:
    """Clear the bits of ids ``first_id`` and up in a packed row; in place."""
    byte = first_id >> 3
    if byte >= len(row):
        return
    if first_id & 7:
        row[byte] &= (1 << (first_id & 7)) - 1
        byte += 1
    row[byte:] = 0
