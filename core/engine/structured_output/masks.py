"""Allowed-token masks for a batch of matchers, with the engine's EOS rules on top.

A backend knows one EOS id (the tokenizer's); the engine may stop on several (the
generation config's ``eos_token_id`` list). ``EosRules`` widens a mask: where the grammar
may end (its mask allows any EOS id) every EOS id is allowed; a terminated grammar allows
EOS only; a mask that allows nothing (a dead end the backend could not avoid) also allows
EOS only, so the sampler never sees a row of all ``-inf``. Masks come back as bool
``[vocab_size]`` on the requested device: ids past the backend's mask are forbidden.

On a GPU the masks travel packed: ``DeviceMaskCache`` keeps, per grammar-state mask, the
widened mask as bits on the device (one uint8 per 8 token ids, bit ``id % 8`` of byte
``id // 8``), built once per state; a step then costs a lookup per row and one unpack of
the whole batch on the device instead of a host copy of ``vocab_size`` bools per row.
"""

from __future__ import annotations

import weakref
from collections import OrderedDict
from collections.abc import Sequence
from typing import Any

import numpy as np
import torch
from engine_sdk.interfaces.structured_output import GrammarMatcher

from engine.model_executor.device_tensors import to_device


class EosRules:
    """The engine's EOS ids and the masks built from them (cached per vocabulary size)."""

    def __init__(self, eos_token_ids: Sequence[int]) -> None:
        if not eos_token_ids:
            raise ValueError(
                "structured outputs need at least one EOS token id to end an output; "
                "the tokenizer and generation config define none"
            )
        self.eos_token_ids = tuple(sorted({int(i) for i in eos_token_ids}))
        self._eos_only: dict[int, torch.Tensor] = {}

    def is_eos(self, token_id: int) -> bool:
        return token_id in self.eos_token_ids

    def eos_only(self, vocab_size: int) -> torch.Tensor:
        mask = self._eos_only.get(vocab_size)
        if mask is None:
            mask = torch.zeros(vocab_size, dtype=torch.bool)
            ids = [i for i in self.eos_token_ids if 0 <= i < vocab_size]
            mask[ids] = True
            self._eos_only[vocab_size] = mask
        return mask

    def may_end(self, mask: torch.Tensor) -> bool:
        """Whether ``mask`` allows any EOS id (the grammar is in an accepting state)."""
        size = mask.shape[0]
        return any(bool(mask[i]) for i in self.eos_token_ids if i < size)

    def widen(self, matcher: GrammarMatcher, vocab_size: int) -> torch.Tensor | None:
        """The row mask of ``matcher`` for logits of width ``vocab_size`` (host tensor)."""
        if matcher.is_terminated():
            return self.eos_only(vocab_size)
        mask = matcher.allowed_token_ids()
        if mask is None:
            return None
        return self.widen_mask(mask, vocab_size)

    def widen_mask(self, mask: torch.Tensor, vocab_size: int) -> torch.Tensor:
        """A backend's mask resized to ``vocab_size`` with the EOS rules applied."""
        if mask.shape[0] != vocab_size:
            resized = torch.zeros(vocab_size, dtype=torch.bool)
            num_ids = min(vocab_size, mask.shape[0])
            resized[:num_ids] = mask[:num_ids]
            mask = resized
        if self.may_end(mask):
            ids = [i for i in self.eos_token_ids if i < vocab_size]
            if not all(bool(mask[i]) for i in ids):
                mask = mask.clone()
                mask[ids] = True
        elif not bool(mask.any()):
            return self.eos_only(vocab_size)
        return mask


def batch_masks(
    matchers: Sequence[GrammarMatcher | None],
    vocab_size: int,
    rules: EosRules,
    device: torch.device | str = "cpu",
) -> list[torch.Tensor | None]:
    """One mask (or ``None``: unconstrained) per row; shared tensors, do not modify."""
    target = torch.device(device)
    masks: list[torch.Tensor | None] = []
    for matcher in matchers:
        mask = None if matcher is None else rules.widen(matcher, vocab_size)
        if mask is not None and mask.device != target:
            mask = mask.to(target, non_blocking=True)
        masks.append(mask)
    return masks


class DeviceMaskCache:
    """Widened masks packed into bits on one device, keyed by the backend's mask object.

    Backends hand out one shared tensor per grammar state (see ``GrammarMatcher``), so the
    object identifies the state: the entry holds a weak reference to it and is rebuilt if
    that object is gone (its id reused). Least recently used entries go past
    ``max_entries`` (each is ``vocab_size / 8`` bytes of device memory).
    """

    def __init__(self, rules: EosRules, device: torch.device, max_entries: int = 4096) -> None:
        self.rules = rules
        self.device = device
        self.max_entries = max_entries
        self._entries: OrderedDict[tuple[int, int], tuple[weakref.ref[Any], torch.Tensor]] = (
            OrderedDict()
        )

    def __len__(self) -> int:
        return len(self._entries)

    def packed(self, matcher: GrammarMatcher, vocab_size: int) -> torch.Tensor | None:
        """uint8 ``[ceil(vocab_size / 8)]`` on the device, or ``None`` (unconstrained)."""
        if matcher.is_terminated():
            source, widen = self.rules.eos_only(vocab_size), False
        else:
            allowed = matcher.allowed_token_ids()
            if allowed is None:
                return None
            source, widen = allowed, True
        key = (id(source), vocab_size)
        entry = self._entries.get(key)
        if entry is not None and entry[0]() is source:
            self._entries.move_to_end(key)
            return entry[1]
        mask = self.rules.widen_mask(source, vocab_size) if widen else source
        packed = np.packbits(mask.numpy().astype(np.bool_), bitorder="little")
        on_device = to_device(torch.from_numpy(packed), self.device)
        self._entries[key] = (weakref.ref(source), on_device)
        while len(self._entries) > self.max_entries:
            self._entries.popitem(last=False)
        return on_device


def unpack_masks(packed: torch.Tensor, vocab_size: int) -> torch.Tensor:
    """bool ``[rows, vocab_size]`` from uint8 ``[rows, ceil(vocab_size / 8)]`` (little bit
    order: bit ``i`` of byte ``j`` is token id ``8 * j + i``)."""
    shifts = torch.arange(8, dtype=torch.uint8, device=packed.device)
    bits = (packed[:, :, None] >> shifts) & 1
    return bits.view(packed.shape[0], -1)[:, :vocab_size].bool()
