"""The sampler: one batch of logits in, one token (and optional logprobs) per row out.

Pipeline, each stage vectorised over the rows and skipped when no row uses it::

    logits ─┬─> penalties ─> min_tokens, allowed masks ─┬─> argmax ──────────> greedy rows
            │   (repetition,  (-inf)                     │
            │    presence,                               └─> / temperature ─> top-k ─> top-p
            │    frequency)          ─> min-p ─> softmax ─> exponential race ─> random rows
            └─> log_softmax (raw) ─> chosen logprob, rank, top-k ──────────> logprobs

- Greedy (``temperature < 1e-5``) is exactly ``torch.argmax`` of the processed logits
  (ties: lowest id), so the engine matches Hugging Face ``generate`` token for token.
- Random rows sample by the exponential race: ``argmax(probs / q)`` with ``q ~ Exp(1)``
  per token picks token ``i`` with probability ``probs[i]``. A row with a generator draws
  its ``q`` from that generator alone, so a seeded row gives the same tokens whatever else
  is in the batch; the others share the device's default generator.
- Logprobs are of the raw logits (see ``logprobs.py``).
- No host sync: the token ids (and packed logprobs) are copied back in one queued copy,
  which ``DeviceSample.to_host`` waits for; the ids also stay on the device.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import torch

from engine.core.scheduler_output import Logprobs
from engine.model_executor.device_tensors import host_tensor, to_device
from engine.model_executor.host_copy import HostCopy
from engine.model_executor.logit_masks import (
    apply_allowed_token_masks,
    apply_logit_bias,
    apply_min_tokens,
    apply_packed_masks,
)
from engine.model_executor.logprobs import (
    compute_prompt_logprobs,
    gather_logprobs,
    unpack_logprobs,
)
from engine.model_executor.penalties import apply_penalties, needs_penalties
from engine.model_executor.topk_topp import apply_min_p, apply_top_k_top_p
from engine.sampling_params import SamplingParams
from engine.structured_output.masks import PackedMasks

__all__ = [
    "DeviceSample",
    "Sampler",
    "SamplerOutput",
    "SamplingBatch",
    "compute_prompt_logprobs",
]


@dataclass
class SamplingBatch:
    """Per-row inputs of one ``Sampler`` call; every list has one entry per logits row."""

    params: list[SamplingParams]
    generators: list[torch.Generator | None]
    prompt_token_ids: list[list[int]]
    output_token_ids: list[list[int]]
    # Structured outputs: bool [V] per row (True = allowed), None = unconstrained; or
    # packed rows for the whole batch on the logits' device (the engine's path).
    allowed_token_masks: list[torch.Tensor | None] | PackedMasks | None = None

    def __post_init__(self) -> None:
        num_rows = len(self.params)
        lists: dict[str, Sequence[object] | None] = {
            "generators": self.generators,
            "prompt_token_ids": self.prompt_token_ids,
            "output_token_ids": self.output_token_ids,
            "allowed_token_masks": self.allowed_token_masks,
        }
        for name, values in lists.items():
            if values is not None and len(values) != num_rows:
                raise ValueError(
                    f"SamplingBatch.{name} has {len(values)} entries but params has "
                    f"{num_rows}; pass one entry per row"
                )

    def __len__(self) -> int:
        return len(self.params)


@dataclass
class SamplerOutput:
    token_ids: list[int]
    logprobs: list[Logprobs | None]  # None where the row's params.logprobs is None


class Sampler:
    """All per-request state (generators, token history) comes in the batch; the sampler
    keeps only the buffers of its one-launch path (``_row_samplers``)."""

    def __init__(self) -> None:
        self._row_samplers: dict[tuple[torch.device, int], Any] = {}  # RowSampler

    def __call__(self, logits: torch.Tensor, batch: SamplingBatch) -> SamplerOutput:
        return self.sample_on_device(logits, batch).to_host()

    def plain_greedy(self, batch: SamplingBatch) -> bool:
        """Whether every row's token is the argmax of its raw logits: greedy, no logprobs,
        and nothing that changes the logits (penalties, bias, min_tokens, masks)."""
        return all(p.greedy and p.logprobs is None for p in batch.params) and not any(
            self._needs_processing(batch)
        )

    def plain_rows(self, batch: SamplingBatch, vocab_size: int) -> bool:
        """Whether every row's token is the decode graph's (``engine_sdk.layers.sampling``):
        ``plain_greedy`` rows, and random rows that only scale by a temperature (no
        top-k/top-p/min-p, no seed: the graph's noise is not the request's generator), with
        no logprobs and nothing that changes the logits."""
        return not any(self._needs_processing(batch)) and self._temperature_only(batch, vocab_size)

    def _temperature_only(self, batch: SamplingBatch, vocab_size: int) -> bool:
        """Every row greedy or scaled by a temperature alone: no top-k/top-p/min-p, no
        seed (a generator of its own), no logprobs."""
        for p, generator in zip(batch.params, batch.generators, strict=True):
            if p.logprobs is not None:
                return False
            if p.greedy:
                continue
            if generator is not None or p.top_p < 1.0 or p.min_p > 0.0:
                return False
            if 0 < p.top_k < vocab_size:
                return False
        return True

    def greedy_sample(self, token_ids: torch.Tensor, batch: SamplingBatch) -> DeviceSample:
        """The sample of a ``plain_greedy`` (or ``plain_rows``) batch whose tokens are
        already computed (the decode graph's)."""
        return DeviceSample(token_ids, batch.params, [], HostCopy([token_ids]))

    def sample_on_device(self, logits: torch.Tensor, batch: SamplingBatch) -> DeviceSample:
        """Sample every row without waiting for the device; the ids stay there (the next
        step's inputs) and a copy to the host is queued (``DeviceSample.to_host``)."""
        if logits.dim() != 2 or logits.shape[0] != len(batch):
            raise ValueError(
                f"Sampler expects logits [num_rows, vocab_size] with num_rows == "
                f"len(batch) == {len(batch)}, got shape {tuple(logits.shape)}"
            )
        params = batch.params
        masked = self._masked_rows(logits, batch)
        if masked is not None:
            return DeviceSample(masked, params, [], HostCopy([masked]))
        processed = self._process_logits(logits, batch)
        token_ids = processed.argmax(dim=-1)
        random_rows = [i for i, p in enumerate(params) if not p.greedy]
        if random_rows:
            sampled = self._sample_random(processed, batch, random_rows)
            if len(random_rows) == len(params):
                token_ids = sampled
            else:
                rows = _index_tensor(random_rows, logits.device)
                token_ids = token_ids.index_copy(0, rows, sampled)
        return self._gather_logprobs(logits, token_ids, params)

    def _masked_rows(self, logits: torch.Tensor, batch: SamplingBatch) -> torch.Tensor | None:
        """Structured outputs' common case in one launch (``RowSampler`` with the packed
        masks: one pass over the logits instead of the unpack, the masked copy, argmax,
        softmax and the race): temperature-only rows under ``PackedMasks`` and nothing
        else that edits the logits, on CUDA (``ENGINE_MASKED_ROW_SAMPLER=0``: off;
        ``force``: on any device, through Triton's interpreter on a CPU). None: the
        pipeline above runs."""
        masks = batch.allowed_token_masks
        if not isinstance(masks, PackedMasks):
            return None
        mode = os.environ.get("ENGINE_MASKED_ROW_SAMPLER", "1")
        if mode == "0" or (not logits.is_cuda and mode != "force"):
            return None
        num_rows, vocab_size = logits.shape
        if masks.vocab_size != vocab_size or len(masks) != num_rows:
            return None  # the pipeline's apply_packed_masks says what is wrong
        if masks.bits.device != logits.device or logits.stride(1) != 1:
            return None
        min_tokens, _, penalties, bias = self._needs_processing(batch)
        if min_tokens or penalties or bias or not self._temperature_only(batch, vocab_size):
            return None
        # imported here: this module is on the API server's and grammar workers' import
        # path, where loading the SDK's layers would slow every worker's start
        from engine_sdk.layers.sampling import RowSampler

        key = (logits.device, vocab_size)
        sampler = self._row_samplers.get(key)
        if sampler is None or sampler.max_rows < num_rows:
            max_rows = max(num_rows, 2 * sampler.max_rows if sampler is not None else 64)
            sampler = self._row_samplers[key] = RowSampler(max_rows, vocab_size, logits.device)
        temps = row_sampler_temperatures(batch.params)
        temperatures = host_tensor(temps, torch.float32, logits.device)
        return sampler(logits, temperatures, masks.bits)

    # -- phases ---------------------------------------------------------------------------

    def _needs_processing(self, batch: SamplingBatch) -> tuple[bool, bool, bool, bool]:
        """Which logits stages run: (min_tokens, masks, penalties, bias); all False: none."""
        params = batch.params
        uses_min_tokens = any(
            p.min_tokens > len(out) for p, out in zip(params, batch.output_token_ids, strict=True)
        )
        masks = batch.allowed_token_masks
        packed = isinstance(masks, PackedMasks)
        uses_masks = masks is not None and (packed or any(m is not None for m in masks))
        return (
            uses_min_tokens,
            uses_masks,
            needs_penalties(params),
            any(p.logit_bias for p in params),
        )

    def _process_logits(self, logits: torch.Tensor, batch: SamplingBatch) -> torch.Tensor:
        """Penalties and hard masks, on a float32 copy (the caller's logits stay intact,
        they are needed raw for logprobs)."""
        params = batch.params
        masks = batch.allowed_token_masks
        uses_min_tokens, uses_masks, uses_penalties, uses_bias = self._needs_processing(batch)
        if not (uses_min_tokens or uses_masks or uses_penalties or uses_bias):
            return logits.float()
        if isinstance(masks, PackedMasks) and not (uses_min_tokens or uses_penalties or uses_bias):
            # The masked copy is the working copy: one pass over the logits.
            return apply_packed_masks(logits.float(), masks, in_place=False)
        work = torch.empty(logits.shape, dtype=torch.float32, device=logits.device)
        work.copy_(logits)  # contiguous whatever the caller's strides
        if uses_bias:
            apply_logit_bias(work, params)
        if uses_penalties:
            apply_penalties(work, params, batch.prompt_token_ids, batch.output_token_ids)
        if uses_min_tokens:
            apply_min_tokens(work, params, batch.output_token_ids)
        if uses_masks:
            assert masks is not None
            apply_allowed_token_masks(work, masks)
        return work

    def _sample_random(
        self, processed: torch.Tensor, batch: SamplingBatch, random_rows: list[int]
    ) -> torch.Tensor:
        """Temperature, truncation and the exponential race for the non-greedy rows."""
        device = processed.device
        vocab_size = processed.shape[1]
        params = [batch.params[i] for i in random_rows]
        if len(random_rows) == len(batch):
            logits = processed
        else:
            logits = processed[_index_tensor(random_rows, device)]

        temperatures = [p.temperature for p in params]
        if any(t != 1.0 for t in temperatures):
            logits = logits / _float_tensor(temperatures, device)[:, None]

        top_ks = [p.top_k if 0 < p.top_k < vocab_size else vocab_size for p in params]
        top_k = _index_tensor(top_ks, device) if min(top_ks) < vocab_size else None
        max_top_k = max((k for k in top_ks if k < vocab_size), default=vocab_size)
        top_p = None
        if any(p.top_p < 1.0 for p in params):
            top_p = _float_tensor([p.top_p for p in params], device)
        logits = apply_top_k_top_p(logits, top_k, top_p, max_top_k)
        if any(p.min_p > 0.0 for p in params):
            logits = apply_min_p(logits, _float_tensor([p.min_p for p in params], device))

        probs = logits.softmax(dim=-1)
        generators = [batch.generators[i] for i in random_rows]
        return _exponential_race(probs, generators)

    def _gather_logprobs(
        self, logits: torch.Tensor, token_ids: torch.Tensor, params: list[SamplingParams]
    ) -> DeviceSample:
        """Logprobs of the raw logits, packed with the ids for one copy to the host."""
        logprob_rows = [i for i, p in enumerate(params) if p.logprobs is not None]
        if not logprob_rows:
            return DeviceSample(token_ids, params, [], HostCopy([token_ids]))
        num_top = max(params[i].logprobs or 0 for i in logprob_rows)
        rows = _index_tensor(logprob_rows, logits.device)
        raw_logprobs = logits[rows].float().log_softmax(dim=-1)
        packed = gather_logprobs(raw_logprobs, token_ids[rows], num_top)
        flat = torch.cat([token_ids.double(), packed.flatten()])
        return DeviceSample(token_ids, params, logprob_rows, HostCopy([flat]))


def row_sampler_temperatures(params: Sequence[SamplingParams]) -> list[float]:
    """Each row's temperature as ``RowSampler`` takes it: 0 for a greedy row."""
    return [0.0 if p.greedy else float(p.temperature) for p in params]


class DeviceSample:
    """One sampler call's result while it may still be computing: ``token_ids`` (long
    ``[num_rows]``) on the device, and its host copy, read by ``to_host``."""

    def __init__(
        self,
        token_ids: torch.Tensor,
        params: list[SamplingParams],
        logprob_rows: list[int],
        host_copy: HostCopy,
    ) -> None:
        self.token_ids = token_ids
        self._params = params
        self._logprob_rows = logprob_rows
        self._host_copy = host_copy

    def to_host(self) -> SamplerOutput:
        """Wait for the sampled ids (and logprobs) and return them as Python values."""
        (host,) = self._host_copy.wait()
        params = self._params
        num_rows = len(params)
        if not self._logprob_rows:
            return SamplerOutput(token_ids=host.tolist(), logprobs=[None] * num_rows)
        ids = [int(t) for t in host[:num_rows].tolist()]
        packed_rows = host[num_rows:].view(len(self._logprob_rows), -1).tolist()
        out_logprobs: list[Logprobs | None] = [None] * num_rows
        for i, row in zip(self._logprob_rows, packed_rows, strict=True):
            out_logprobs[i] = unpack_logprobs(row, params[i].logprobs or 0)
        return SamplerOutput(token_ids=ids, logprobs=out_logprobs)


def _exponential_race(
    probs: torch.Tensor, generators: Sequence[torch.Generator | None]
) -> torch.Tensor:
    """``argmax(probs / q)``, ``q ~ Exp(1)`` i.i.d.: row ``i`` picks token ``j`` with
    probability ``probs[i, j]``. Seeded rows draw ``q`` from their own generator."""
    q = torch.empty_like(probs)
    if any(g is None for g in generators):
        q.exponential_()  # one launch for the unseeded rows; seeded rows are overwritten
    for row, generator in enumerate(generators):
        if generator is None:
            continue
        if generator.device == probs.device:
            q[row].exponential_(generator=generator)
        else:
            draws = torch.empty(probs.shape[1], device=generator.device)
            q[row] = to_device(draws.exponential_(generator=generator), probs.device)
    # q == 0 would turn a zero probability into 0/0 = NaN, which argmax would pick.
    q.clamp_(min=torch.finfo(q.dtype).tiny)
    return (probs / q).argmax(dim=-1)


def _index_tensor(values: list[int], device: torch.device) -> torch.Tensor:
    return host_tensor(values, torch.long, device)


def _float_tensor(values: list[float], device: torch.device) -> torch.Tensor:
    return host_tensor(values, torch.float32, device)
