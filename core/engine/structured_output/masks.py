"""Allowed-token masks for a batch of matchers, with the engine's EOS rules on top.

A backend knows one EOS id (the tokenizer's); the engine may stop on several (the
generation config's ``eos_token_id`` list). ``EosRules`` widens a mask: where the grammar
may end (its mask allows any EOS id) every EOS id is allowed; a terminated grammar allows
EOS only; a mask that allows nothing (a dead end the backend could not avoid) also allows
EOS only, so the sampler never sees a row of all ``-inf``. Masks come back as bool
``[vocab_size]`` on the requested device: ids past the backend's mask are forbidden.

On the engine's path the masks are packed bits (``PackedMasks``: uint8, bit ``id % 8`` of
byte ``id // 8``), one row per sampling row, gathered on the device from the mask table
(``mask_table.py``); ``EosRules.widen_bits`` applies the same rules to a packed row.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import torch
from engine_sdk.interfaces.structured_output import GrammarMatcher


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

    def eos_only_bits(self, row: np.ndarray, vocab_size: int) -> np.ndarray:
        """``row`` (packed, see ``PackedMasks``) set to the EOS ids only; in place."""
        row[:] = 0
        for i in self.eos_token_ids:
            if 0 <= i < vocab_size:
                row[i >> 3] |= 1 << (i & 7)
        return row

    def widen_bits(self, row: np.ndarray, vocab_size: int) -> np.ndarray:
        """``widen_mask`` for a packed row already cut to ``vocab_size`` ids; in place."""
        ids = [i for i in self.eos_token_ids if i < vocab_size]
        if any((row[i >> 3] >> (i & 7)) & 1 for i in ids):
            for i in ids:
                row[i >> 3] |= 1 << (i & 7)
        elif not row.any():
            self.eos_only_bits(row, vocab_size)
        return row

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


def forbidden_bits_table(device: torch.device) -> torch.Tensor:
    """bool ``[256, 8]``: row ``b`` says which of byte ``b``'s 8 bits are 0 (forbidden
    ids), so a packed row unpacks in one gather."""
    byte = torch.arange(256, dtype=torch.int32)[:, None]
    return (((byte >> torch.arange(8, dtype=torch.int32)) & 1) == 0).to(device)


@dataclass
class PackedMasks:
    """One packed mask per sampling row, on the logits' device.

    ``bits``: uint8 ``[num_rows, num_bytes]``, bit ``id % 8`` of byte ``id // 8`` set where
    token ``id`` is allowed (an unconstrained row has every bit set); ``num_bytes * 8`` is
    at least ``vocab_size``. ``lut``: ``forbidden_bits_table`` on the same device.
    """

    bits: torch.Tensor
    lut: torch.Tensor
    vocab_size: int

    def __len__(self) -> int:
        return int(self.bits.shape[0])

    def forbidden(self) -> torch.Tensor:
        """bool ``[num_rows, vocab_size]``: True where a token is not allowed."""
        num_rows, num_bytes = self.bits.shape
        unpacked = self.lut.index_select(0, self.bits.view(-1).int())
        return unpacked.view(num_rows, num_bytes * 8)[:, : self.vocab_size]
