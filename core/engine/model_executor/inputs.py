"""Turn one ``SchedulerOutput`` into the model's step inputs (built on the host, one copy).

Tokens are packed request after request. Each token's cache slot comes from its
request's block table::

    position p  ->  slot = block_ids[p // block_size] * block_size + p % block_size

    block_size 4, block_ids [7, 2], positions 3..5:
        p=3 -> 7*4+3 = 31      p=4 -> 2*4+0 = 8      p=5 -> 2*4+1 = 9

Logits are computed only for the rows that need them, in this order: first the prompt
positions of requests that asked for prompt logprobs (position p predicts prompt token
p + 1), then one row per sampling request (its last token this step).

The host work is a few Python passes over the requests (reading their fields) and numpy
for everything per token or per block. Block tables are the one input that grows with the
context: ``StepInputsBuilder`` (a runner holds one) keeps them across steps and copies
only new block ids, where the stateless ``build_step_inputs`` copies every table whole.
The integer arrays travel to the device as one buffer (one copy); the tensors are views
into it.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from itertools import chain

import numpy as np
import torch
from engine_sdk.interfaces.attention import AttentionBatch

from engine.core.request import ReqId
from engine.core.scheduler_output import PLACEHOLDER_TOKEN_ID, ScheduledRequest, SchedulerOutput

__all__ = [
    "PersistentBlockTables",
    "PromptLogprobsRows",
    "StepInputs",
    "StepInputsBuilder",
    "build_step_inputs",
]


@dataclass
class PromptLogprobsRows:
    """Rows ``[first_row, first_row + len(target_token_ids))`` of the step's logits."""

    req_id: ReqId
    first_row: int
    target_token_ids: list[int]
    num_logprobs: int


@dataclass
class StepInputs:
    input_ids: torch.Tensor  # int64 [num_tokens]
    positions: torch.Tensor  # int64 [num_tokens]
    attn_batch: AttentionBatch
    logits_indices: torch.Tensor  # int64 [num_logits_rows]: rows of the hidden states
    sample_requests: list[ScheduledRequest] = field(default_factory=list)
    num_prompt_rows: int = 0  # sample rows start after the prompt-logprob rows
    prompt_rows: list[PromptLogprobsRows] = field(default_factory=list)
    # Async scheduling: input_ids rows holding PLACEHOLDER_TOKEN_ID, and for each the row of
    # the previous step's sampled ids to take instead (both int64 on the device, or None).
    placeholder_rows: torch.Tensor | None = None
    placeholder_sources: torch.Tensor | None = None
    # LoRA: each token's adapter slot (int32 [num_tokens], -1: none) when LoRA is on, and
    # whether any token has an adapter (else the layers skip their LoRA work).
    lora_token_slots: torch.Tensor | None = None
    lora_active: bool = False


def _prompt_rows(
    sr: ScheduledRequest, first_token_row: int, num_done: int
) -> tuple[list[int], PromptLogprobsRows | None]:
    """Hidden-state rows whose logits give prompt logprobs, skipping positions done before."""
    num_logprobs = sr.request.sampling_params.prompt_logprobs
    if num_logprobs is None:
        return [], None
    prompt = sr.request.prompt_token_ids
    first = max(sr.start_position, num_done)
    last = min(sr.start_position + len(sr.token_ids), len(prompt) - 1)  # exclusive
    if first >= last:
        return [], None
    rows = [first_token_row + p - sr.start_position for p in range(first, last)]
    targets = prompt[first + 1 : last + 1]
    return rows, PromptLogprobsRows(sr.req_id, 0, targets, num_logprobs)


def _check_block_tables(
    scheduled: list[ScheduledRequest], num_blocks: np.ndarray, block_size: int
) -> np.ndarray:
    """Each request's block-list length; ValueError if one does not reach its last token."""
    num_seqs = len(scheduled)
    lengths = np.fromiter((len(sr.block_ids) for sr in scheduled), np.int64, num_seqs)
    short = np.flatnonzero(lengths < num_blocks)
    if len(short):
        sr = scheduled[int(short[0])]
        last = sr.start_position + len(sr.token_ids) - 1
        raise ValueError(
            f"request {sr.req_id}: position {last} is beyond its block table "
            f"({len(sr.block_ids)} blocks of {block_size} tokens)"
        )
    return lengths


def _block_table(
    scheduled: list[ScheduledRequest], num_blocks: np.ndarray, block_size: int
) -> np.ndarray:
    """int32 [num_seqs, max blocks]: each request's first ``num_blocks[i]`` block ids.

    The rows are filled in one masked assignment from the concatenated block lists (row-
    major order of the mask is request order, then block order).
    """
    num_seqs = len(scheduled)
    num_cols = int(num_blocks.max()) if num_seqs else 0
    table = np.zeros((num_seqs, num_cols), dtype=np.int32)
    if not num_seqs:
        return table
    lengths = _check_block_tables(scheduled, num_blocks, block_size)
    if np.array_equal(lengths, num_blocks):
        rows = [sr.block_ids for sr in scheduled]
    else:  # the scheduler allocates exactly what a step reaches; tolerate longer tables
        rows = [sr.block_ids[:k] for sr, k in zip(scheduled, num_blocks.tolist(), strict=True)]
    flat = np.fromiter(chain.from_iterable(rows), np.int32, int(num_blocks.sum()))
    table[np.arange(num_cols) < num_blocks[:, None]] = flat
    return table


class PersistentBlockTables:
    """Block tables kept across steps, so a step copies only the block ids that are new.

    A request's table only grows while it runs (one new block every ``block_size`` decode
    steps), so each running request owns a row of a preallocated int32 array and a step
    writes the ids past what the row already holds, then gathers its rows in one numpy
    indexing. Rows are dropped for ``finished_req_ids`` and ``preempted_req_ids`` (a
    preempted request gets a new table when it is resumed). As a guard, a row whose last
    held id no longer matches the request's table is rewritten whole.

        row of "a":  [7 2 5 0 0 0]   held 3, last 5     step needs 4 -> write ids[3:4]
    """

    def __init__(self, initial_rows: int = 64, initial_cols: int = 64) -> None:
        self._rows = np.zeros((initial_rows, initial_cols), dtype=np.int32)
        # req_id -> [row index, number of ids held, last id held]
        self._held: dict[ReqId, list[int]] = {}
        self._free_rows = list(range(initial_rows - 1, -1, -1))

    @property
    def num_tracked(self) -> int:
        return len(self._held)

    def drop(self, req_ids: Iterable[ReqId]) -> None:
        for req_id in req_ids:
            held = self._held.pop(req_id, None)
            if held is not None:
                self._rows[held[0], : held[1]] = 0
                self._free_rows.append(held[0])

    def gather(
        self, scheduled: list[ScheduledRequest], num_blocks: np.ndarray, block_size: int
    ) -> np.ndarray:
        """int32 [num_seqs, max blocks], like ``_block_table``."""
        num_seqs = len(scheduled)
        num_cols = int(num_blocks.max()) if num_seqs else 0
        if not num_seqs:
            return np.zeros((0, 0), dtype=np.int32)
        if num_cols > self._rows.shape[1]:
            self._grow(self._rows.shape[0], max(num_cols, 2 * self._rows.shape[1]))
        held_map = self._held
        row_ids = []
        stale = []
        for sr, needed in zip(scheduled, num_blocks.tolist(), strict=True):
            held = held_map.get(sr.req_id)
            if held is None:
                held = held_map[sr.req_id] = [self._take_row(), 0, -1]
            num_held = held[1]
            if needed > num_held or (num_held and _replaced(sr.block_ids, num_held, held[2])):
                stale.append((sr, needed, held))
            row_ids.append(held[0])
        if stale:
            self._write(stale, block_size)
        return self._rows[row_ids, :num_cols]

    def _write(self, stale: list[tuple[ScheduledRequest, int, list[int]]], block_size: int) -> None:
        rows = self._rows
        for sr, needed, held in stale:
            row, num_held, last = held
            block_ids = sr.block_ids
            if len(block_ids) < needed:
                raise ValueError(
                    f"request {sr.req_id}: position {sr.start_position + len(sr.token_ids) - 1} "
                    f"is beyond its block table ({len(block_ids)} blocks of {block_size} tokens)"
                )
            if num_held and _replaced(block_ids, num_held, last):  # rewrite the row
                rows[row, :num_held] = 0
                num_held = 0
            if needed > num_held:
                rows[row, num_held:needed] = block_ids[num_held:needed]
                held[1] = needed
                held[2] = block_ids[needed - 1]

    def _take_row(self) -> int:
        if not self._free_rows:
            num_rows = self._rows.shape[0]
            self._grow(2 * num_rows, self._rows.shape[1])
            self._free_rows.extend(range(2 * num_rows - 1, num_rows - 1, -1))
        return self._free_rows.pop()

    def _grow(self, num_rows: int, num_cols: int) -> None:
        rows = np.zeros((num_rows, num_cols), dtype=np.int32)
        old = self._rows
        rows[: old.shape[0], : old.shape[1]] = old
        self._rows = rows


def _replaced(block_ids: list[int], num_held: int, last_held: int) -> bool:
    """Whether a table no longer extends the ``num_held`` ids a row holds."""
    return len(block_ids) < num_held or block_ids[num_held - 1] != last_held


class _Packer:
    """Host arrays that go to the device as one byte buffer; each becomes a view."""

    def __init__(self) -> None:
        self._arrays: list[np.ndarray] = []

    def add(self, array: np.ndarray) -> int:
        self._arrays.append(np.ascontiguousarray(array))
        return len(self._arrays) - 1

    def to_device(self, device: torch.device) -> list[torch.Tensor]:
        # Every segment starts on a 16-byte boundary: it can be viewed as int64, and kernels
        # that specialise on 16-byte aligned pointers (Triton) see the usual alignment.
        offsets, size = [], 0
        for array in self._arrays:
            offsets.append(size)
            size += -(-array.nbytes // 16) * 16
        # Pinned on CUDA, so the copy is queued rather than waited for (a copy from
        # pageable memory synchronises the stream: the host would wait for the step in
        # flight). PyTorch's pinned-memory cache keeps the buffer until the copy has run.
        host = torch.empty(size, dtype=torch.uint8, pin_memory=device.type == "cuda")
        buffer = host.numpy()
        for array, offset in zip(self._arrays, offsets, strict=True):
            buffer[offset : offset + array.nbytes] = array.reshape(-1).view(np.uint8)
        on_device = host.to(device, non_blocking=True)
        tensors = []
        for array, offset in zip(self._arrays, offsets, strict=True):
            dtype = torch.int64 if array.dtype == np.int64 else torch.int32
            segment = on_device[offset : offset + array.nbytes].view(dtype)
            tensors.append(segment.view(array.shape))
        return tensors


TableFn = Callable[[list[ScheduledRequest], np.ndarray, int], np.ndarray]


class StepInputsBuilder:
    """Builds one runner's step inputs, keeping block tables from step to step.

    Equivalent to ``build_step_inputs`` on every step, but a decode step copies only the
    new block ids instead of every request's whole table. It relies on seeing every
    non-empty ``SchedulerOutput`` of the scheduler, in order (their ``finished_req_ids``
    and ``preempted_req_ids`` retire rows).
    """

    def __init__(self, block_size: int, device: torch.device) -> None:
        self.block_size = block_size
        self.device = device
        self.block_tables = PersistentBlockTables()

    def build(
        self,
        so: SchedulerOutput,
        prompt_logprobs_done: dict[ReqId, int],
        prev_sample_rows: dict[ReqId, int] | None = None,
        lora_slots: list[int] | None = None,
    ) -> StepInputs:
        """``prev_sample_rows``: each request's row in the previous step's sampled ids,
        where its placeholder input comes from. ``lora_slots``: each scheduled request's
        adapter slot (-1: none), with LoRA on."""
        self.block_tables.drop(so.finished_req_ids)
        self.block_tables.drop(so.preempted_req_ids)
        return _build(
            so,
            self.block_size,
            self.device,
            prompt_logprobs_done,
            self.block_tables.gather,
            prev_sample_rows or {},
            lora_slots,
        )


def build_step_inputs(
    so: SchedulerOutput,
    block_size: int,
    device: torch.device,
    prompt_logprobs_done: dict[ReqId, int],
) -> StepInputs:
    """Pack the step. ``prompt_logprobs_done[req_id]`` is the first prompt position whose
    logprobs are still owed (updated here), so a recomputed prompt is not reported twice.

    Stateless: every block table is copied whole. A runner should hold a
    ``StepInputsBuilder``, which gives the same inputs while copying only new block ids.
    """
    return _build(so, block_size, device, prompt_logprobs_done, _block_table, {})


def _build(
    so: SchedulerOutput,
    block_size: int,
    device: torch.device,
    prompt_logprobs_done: dict[ReqId, int],
    make_table: TableFn,
    prev_sample_rows: dict[ReqId, int],
    lora_slots: list[int] | None = None,
) -> StepInputs:
    scheduled = so.scheduled
    num_seqs = len(scheduled)
    # One pass over the requests for what only Python objects hold.
    token_lists = [sr.token_ids for sr in scheduled]
    num_tokens_list = [len(t) for t in token_lists]
    starts = np.fromiter((sr.start_position for sr in scheduled), np.int64, num_seqs)
    counts = np.array(num_tokens_list, dtype=np.int64)
    num_tokens = int(counts.sum())
    if num_tokens == num_seqs:  # a decode step: one token each
        input_ids = np.fromiter((t[0] for t in token_lists), np.int64, num_seqs)
    else:
        input_ids = np.fromiter(chain.from_iterable(token_lists), np.int64, num_tokens)
    query_start = np.zeros(num_seqs + 1, dtype=np.int64)
    np.cumsum(counts, out=query_start[1:])
    seq_lens = starts + counts

    # positions: start_i + (row - query_start_i) for each row of request i
    if num_tokens == num_seqs:
        positions = starts
        token_req = np.arange(num_seqs)
    else:
        token_req = np.repeat(np.arange(num_seqs), counts)
        positions = np.arange(num_tokens) + (starts - query_start[:-1])[token_req]
    num_blocks = -(-seq_lens // block_size)
    table = make_table(scheduled, num_blocks, block_size)
    slots = table[token_req, positions // block_size].astype(np.int64) * block_size
    slots += positions % block_size

    sample_requests = [sr for sr in scheduled if sr.sample]
    last_rows = query_start[1:] - 1
    if len(sample_requests) == num_seqs:
        sample_rows = last_rows
    else:
        sample_rows = last_rows[[i for i, sr in enumerate(scheduled) if sr.sample]]
    prompt_hidden_rows: list[int] = []
    prompt_rows: list[PromptLogprobsRows] = []
    for i, sr in enumerate(scheduled):
        if sr.request.sampling_params.prompt_logprobs is None:
            continue
        first_row = int(query_start[i])
        rows, pl = _prompt_rows(sr, first_row, prompt_logprobs_done.get(sr.req_id, 0))
        if pl is not None:
            pl.first_row = len(prompt_hidden_rows)
            prompt_hidden_rows.extend(rows)
            prompt_rows.append(pl)
            prompt_logprobs_done[sr.req_id] = sr.start_position + len(sr.token_ids)
    if prompt_hidden_rows:
        logits_indices = np.concatenate([np.array(prompt_hidden_rows, np.int64), sample_rows])
    else:
        logits_indices = sample_rows

    packer = _Packer()
    parts = [
        packer.add(input_ids),
        packer.add(positions),
        packer.add(query_start.astype(np.int32)),
        packer.add(seq_lens.astype(np.int32)),
        packer.add(table),
        packer.add(slots),
        packer.add(logits_indices.astype(np.int64)),
    ]
    lora_part = None
    if lora_slots is not None:
        lora_part = packer.add(np.asarray(lora_slots, dtype=np.int32)[token_req])
    placeholder_rows = np.flatnonzero(input_ids == PLACEHOLDER_TOKEN_ID)
    if len(placeholder_rows):
        sources = _placeholder_sources(scheduled, token_req[placeholder_rows], prev_sample_rows)
        parts += [packer.add(placeholder_rows.astype(np.int64)), packer.add(sources)]
    tensors = packer.to_device(device)
    ids_t, positions_t, query_start_t, seq_lens_t, table_t, slots_t, logits_t = (
        tensors[i] for i in parts[:7]
    )
    rows_t, sources_t = (tensors[parts[7]], tensors[parts[8]]) if len(parts) > 7 else (None, None)
    attn_batch = AttentionBatch(
        query_start_loc=query_start_t,
        seq_lens=seq_lens_t,
        block_tables=table_t,
        slot_mapping=slots_t,
        max_query_len=max(num_tokens_list, default=0),
        max_seq_len=int(seq_lens.max()) if num_seqs else 0,
        num_seqs=num_seqs,
        num_tokens=num_tokens,
        query_start_loc_cpu=query_start.tolist(),
        seq_lens_cpu=seq_lens.tolist(),
    )
    return StepInputs(
        input_ids=ids_t,
        positions=positions_t,
        attn_batch=attn_batch,
        logits_indices=logits_t,
        sample_requests=sample_requests,
        num_prompt_rows=len(prompt_hidden_rows),
        prompt_rows=prompt_rows,
        placeholder_rows=rows_t,
        placeholder_sources=sources_t,
        lora_token_slots=None if lora_part is None else tensors[lora_part],
        lora_active=lora_slots is not None and any(s >= 0 for s in lora_slots),
    )


def _placeholder_sources(
    scheduled: list[ScheduledRequest],
    request_indices: np.ndarray,
    prev_sample_rows: dict[ReqId, int],
) -> np.ndarray:
    """For each placeholder input, the row of its request in the previous step's samples."""
    sources = np.empty(len(request_indices), dtype=np.int64)
    for j, i in enumerate(request_indices.tolist()):
        req_id = scheduled[i].req_id
        row = prev_sample_rows.get(req_id)
        if row is None:
            raise RuntimeError(
                f"request {req_id!r} has a placeholder input but the previous step did not "
                "sample it (async scheduling state out of step)"
            )
        sources[j] = row
    return sources
