"""The Triton attention backend: metadata per step, store K/V, one paged-attention launch.

An fp8 KV cache (``float8_e4m3fn``, ``--kv-cache-dtype fp8``) is quantized in the store
kernel and dequantized in the attention kernel with the layer's ``kv_scales``; Triton's
``fp8e4nv`` needs CUDA compute capability >= 8.9.
"""

from __future__ import annotations

import os
from dataclasses import dataclass

import numpy as np
import torch
import triton
from engine_sdk.interfaces.attention import (
    AttentionBackend,
    AttentionBatch,
    AttentionLayerConfig,
    KVStoreTarget,
)
from engine_sdk.layers.pdl import pdl_launch
from engine_sdk.layers.split_k import num_multiprocessors

from engine_triton.kernels import combine_splits_kernel, paged_attention_kernel, store_kv_kernel

_FP8_KV_CACHE_DTYPES = ("fp8", "fp8_e4m3")
# Split KV (decode): split each (sequence, KV head) program until about this many programs
# per multiprocessor run, at most MAX_KV_SPLITS ways (a power of two).
SPLIT_PROGRAMS_PER_SM = 2
MAX_KV_SPLITS = 16
SPLIT_BLOCK_N = 32  # KV tile of a split decode program (short chunks: less masked work)
# Launches with query blocks (prefill, chunks, mixed steps): (least BLOCK_M rows, BLOCK_N
# for head_dim <= 128, warps, pipeline stages); benchmarks/attention_prefill_sweep_gpu.py
# measures the alternatives.
PREFILL_TILES = (64, 64, 4, 2)
# Split decode: the last split of each program merges the parts in the same launch
# (kernels.py); False (ENGINE_TRITON_SPLIT_MERGE=0, for A/B): a second launch
# (combine_splits_kernel) does.
COMBINE_IN_KERNEL = os.environ.get("ENGINE_TRITON_SPLIT_MERGE", "1") != "0"
# Launch the query blocks that attend to the most KV positions first (causal prefill: the
# last blocks of the longest prompts), so the long programs do not form the tail.
HEAVY_FIRST = True


@dataclass
class TritonMetadata:
    batch: AttentionBatch
    work_seq: torch.Tensor  # int32 [num_work]: sequence of each program row
    work_qblock: torch.Tensor  # int32 [num_work]: query block within that sequence
    num_work: int
    block_q: int
    block_m: int
    block_n: int
    num_warps: int
    kv_splits: int = 1  # decode only; see kernels.py
    num_stages: int = 3


def kv_splits(num_seqs: int, num_kv_heads: int, multiprocessors: int) -> int:
    """Ways to split each decode program along the KV positions: the smallest power of two
    (at most ``MAX_KV_SPLITS``) that gives ``SPLIT_PROGRAMS_PER_SM`` programs per
    multiprocessor; 1 when the batch alone has that many."""
    splits = 1
    target = SPLIT_PROGRAMS_PER_SM * multiprocessors
    while splits < MAX_KV_SPLITS and num_seqs * num_kv_heads * splits < target:
        splits *= 2
    return splits


def _tile_sizes(group: int, decode_only: bool, head_dim: int) -> tuple[int, int, int, int, int]:
    """(BLOCK_M rows, BLOCK_Q tokens, BLOCK_N kv tokens, warps, stages) for one launch."""
    if decode_only:
        block_m = max(16, triton.next_power_of_2(group))
        return block_m, 1, 64, 4, 3
    least_m, block_n, warps, stages = PREFILL_TILES
    block_m = max(least_m, triton.next_power_of_2(group))
    if head_dim > 128:
        block_n = min(block_n, 32)
    return block_m, block_m // group, block_n, warps, stages


class TritonAttentionBackend(AttentionBackend):
    name = "triton"
    supports_cuda_graphs = True

    def __init__(self, config: AttentionLayerConfig) -> None:
        super().__init__(config)
        if config.num_heads % config.num_kv_heads:
            raise ValueError(
                f"num_heads ({config.num_heads}) must be a multiple of "
                f"num_kv_heads ({config.num_kv_heads})"
            )
        _check_kv_cache_dtype(config.kv_cache_dtype)
        self.group = config.num_heads // config.num_kv_heads
        self.head_dim_p = triton.next_power_of_2(config.head_dim)
        self.num_kv_heads_p = triton.next_power_of_2(config.num_kv_heads)
        # The split-decode counters (zero between launches); every size made stays alive,
        # since a captured CUDA graph keeps the address it was captured with.
        self._locks: list[torch.Tensor] = []

    def _split_locks(self, num_work: int, device: torch.device) -> torch.Tensor:
        need = num_work * self.config.num_kv_heads
        for locks in self._locks:
            if locks.device == device and locks.numel() >= need:
                return locks
        locks = torch.zeros(max(need, 256 * self.config.num_kv_heads), dtype=torch.int32,
                            device=device)  # fmt: skip
        self._locks.append(locks)
        return locks

    def build_metadata(self, batch: AttentionBatch) -> TritonMetadata:
        block_m, block_q, block_n, warps, stages = _tile_sizes(
            self.group, batch.is_decode_only, self.config.head_dim
        )
        device = batch.query_start_loc.device
        splits = 1
        if batch.is_decode_only:
            work_seq = torch.arange(batch.num_seqs, dtype=torch.int32, device=device)
            work_qblock = torch.zeros(batch.num_seqs, dtype=torch.int32, device=device)
            num_work = batch.num_seqs
            sms = num_multiprocessors(device)
            splits = kv_splits(batch.num_seqs, self.config.num_kv_heads, sms)
            if splits > 1:
                block_n = SPLIT_BLOCK_N
        else:
            starts = np.asarray(batch.query_start_loc_cpu, dtype=np.int64)
            q_lens = np.diff(starts)
            counts = (q_lens + block_q - 1) // block_q
            num_work = int(counts.sum())
            seq_of = np.repeat(np.arange(len(q_lens), dtype=np.int32), counts)
            first = np.repeat(np.cumsum(counts) - counts, counts)
            qblock = (np.arange(num_work) - first).astype(np.int32)
            if HEAVY_FIRST:
                seq_lens = np.asarray(batch.seq_lens_cpu, dtype=np.int64)[seq_of]
                q_len = q_lens[seq_of]
                kv_positions = seq_lens - q_len + np.minimum((qblock + 1) * block_q, q_len)
                order = np.argsort(-kv_positions, kind="stable")
                seq_of, qblock = seq_of[order], qblock[order]
            work_seq = torch.from_numpy(seq_of).to(device, non_blocking=True)
            work_qblock = torch.from_numpy(qblock).to(device, non_blocking=True)
        return TritonMetadata(
            batch, work_seq, work_qblock, num_work, block_q, block_m, block_n, warps, splits,
            stages,
        )  # fmt: skip

    def forward(
        self,
        query: torch.Tensor,
        key: torch.Tensor,
        value: torch.Tensor,
        kv_cache: torch.Tensor,
        metadata: TritonMetadata,
    ) -> torch.Tensor:
        if key.shape[0]:
            self._scales_on(key.device)
            k_cache, v_cache = kv_cache[0], kv_cache[1]
            store_kv_kernel[(key.shape[0],)](
                key,
                value,
                k_cache,
                v_cache,
                metadata.batch.slot_mapping,
                key.stride(0),
                key.stride(1),
                value.stride(0),
                value.stride(1),
                k_cache.stride(1),
                k_cache.stride(2),
                self.kv_scales,
                NUM_KV_HEADS=self.config.num_kv_heads,
                NUM_KV_HEADS_P=self.num_kv_heads_p,
                HEAD_DIM=self.config.head_dim,
                HEAD_DIM_P=self.head_dim_p,
                FP8=kv_cache.dtype == torch.float8_e4m3fn,
                FP8_MAX=torch.finfo(torch.float8_e4m3fn).max,  # named: torch.compile needs it
                **pdl_launch(key),
            )
        return self.forward_stored(query, kv_cache, metadata)

    def _scales_on(self, device: torch.device) -> None:
        if self.kv_scales.device != device:  # a backend built outside torch.device
            self.kv_scales = self.kv_scales.to(device)  # (the kernels take its pointer)

    def kv_store_target(self, kv_cache: torch.Tensor, metadata: TritonMetadata) -> KVStoreTarget:
        """The cache's K and V halves (``kv_cache_shape``'s default layout) and the step's
        slots: a fused q/k/v kernel may write them, then call ``forward_stored``."""
        self._scales_on(kv_cache.device)
        return KVStoreTarget(kv_cache[0], kv_cache[1], metadata.batch.slot_mapping, self.kv_scales)

    def forward_stored(
        self, query: torch.Tensor, kv_cache: torch.Tensor, metadata: TritonMetadata
    ) -> torch.Tensor:
        cfg = self.config
        batch = metadata.batch
        num_tokens = query.shape[0]
        k_cache, v_cache = kv_cache[0], kv_cache[1]
        fp8 = kv_cache.dtype == torch.float8_e4m3fn
        self._scales_on(query.device)
        out = torch.empty(
            num_tokens, cfg.num_heads, cfg.head_dim, dtype=query.dtype, device=query.device
        )
        splits = metadata.kv_splits
        part_acc = part_ml = None
        if metadata.num_work and splits > 1:
            part_acc = torch.empty(
                num_tokens, cfg.num_heads, splits, self.head_dim_p,
                dtype=torch.float32, device=query.device,
            )  # fmt: skip
            part_ml = torch.empty(
                num_tokens, cfg.num_heads, splits, 2, dtype=torch.float32, device=query.device
            )
        combine = part_acc is not None and COMBINE_IN_KERNEL
        locks = self._split_locks(metadata.num_work, query.device) if combine else None
        if metadata.num_work:
            precision = "ieee" if query.dtype == torch.float32 else "tf32"
            paged_attention_kernel[(metadata.num_work, cfg.num_kv_heads, splits)](
                query,
                k_cache,
                v_cache,
                out,
                batch.block_tables,
                batch.seq_lens,
                batch.query_start_loc,
                metadata.work_seq,
                metadata.work_qblock,
                cfg.scale,
                query.stride(0),
                query.stride(1),
                out.stride(0),
                out.stride(1),
                k_cache.stride(0),
                k_cache.stride(1),
                k_cache.stride(2),
                batch.block_tables.stride(0),
                self.kv_scales,
                GROUP=self.group,
                BLOCK_SIZE=cfg.block_size,
                BLOCK_Q=metadata.block_q,
                BLOCK_M=metadata.block_m,
                BLOCK_N=metadata.block_n,
                HEAD_DIM=cfg.head_dim,
                HEAD_DIM_P=self.head_dim_p,
                DOT_PRECISION=precision,
                FP8=fp8,
                WINDOW=cfg.sliding_window or 0,
                SOFT_CAP=float(cfg.logits_soft_cap or 0.0),
                SPLITS=splits,
                part_acc_ptr=part_acc,
                part_ml_ptr=part_ml,
                COMBINE=combine,
                lock_ptr=locks,
                num_warps=metadata.num_warps,
                num_stages=metadata.num_stages,
                **pdl_launch(query),
            )
        if part_acc is not None and not combine:
            combine_splits_kernel[(num_tokens, cfg.num_heads)](
                part_acc, part_ml, out, out.stride(0), out.stride(1),
                SPLITS=splits, HEAD_DIM=cfg.head_dim, HEAD_DIM_P=self.head_dim_p, num_warps=1,
                **pdl_launch(out),
            )  # fmt: skip
        return out.view(num_tokens, cfg.num_heads * cfg.head_dim)


def _check_kv_cache_dtype(kv_cache_dtype: str) -> None:
    """fp8 e4m3 needs Triton's ``fp8e4nv``: CUDA capability 8.9 (Ada) or newer."""
    if kv_cache_dtype == "auto":
        return
    if kv_cache_dtype not in _FP8_KV_CACHE_DTYPES:
        raise ValueError(
            f"the triton attention backend does not support --kv-cache-dtype "
            f"{kv_cache_dtype!r}; use auto, {', '.join(_FP8_KV_CACHE_DTYPES)} or "
            "--attention-backend reference"
        )
    if torch.cuda.is_available() and torch.cuda.get_device_capability() < (8, 9):
        major, minor = torch.cuda.get_device_capability()
        raise ValueError(
            f"--kv-cache-dtype {kv_cache_dtype} with the triton attention backend needs CUDA "
            f"compute capability >= 8.9 (fp8 e4m3), this GPU is {major}.{minor}; use "
            "--kv-cache-dtype auto or --attention-backend reference"
        )
