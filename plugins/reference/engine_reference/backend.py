"""The reference attention backend: torch SDPA over the paged KV cache, one sequence at a time.

Cache layout (the SDK default)::

    kv_cache[0] = K, kv_cache[1] = V      each [num_blocks, block_size, num_kv_heads, head_dim]
    token at position p of a request lives in block block_table[p // block_size],
    row p % block_size; slot = block_id * block_size + p % block_size

A sequence with ``seq_len`` tokens and ``query_len`` new ones attends with the mask::

    query row j (position context + j) sees key k  iff  k <= context + j
                                          (and k > context + j - sliding_window)

With ``logits_soft_cap`` (Gemma 2) the scores are ``cap * tanh(q.k * scale / cap)``, computed
explicitly (SDPA has no soft cap) with the softmax in float32, as transformers' eager path.

An fp8 cache (``float8_e4m3fn`` / ``float8_e5m2``) is written as ``clamp(x / scale)`` cast
to fp8 (through a ``uint8`` view: CPU torch has no fp8 ``index_copy_``) and read back as
``float(stored) * scale`` in the query dtype, with the layer's ``kv_scales``.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from engine_sdk.interfaces.attention import AttentionBackend, AttentionBatch

__all__ = ["ReferenceAttentionBackend"]


_FP8_DTYPES = (torch.float8_e4m3fn, torch.float8_e5m2)


def _cdiv(a: int, b: int) -> int:
    return -(-a // b)


def quantize_kv(x: torch.Tensor, scale: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """``x / scale`` clamped to the fp8 range and cast to ``dtype``."""
    limit = torch.finfo(dtype).max
    return (x.float() / scale).clamp(-limit, limit).to(dtype)


def dequantize_kv(x: torch.Tensor, scale: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """``float(x) * scale`` in ``dtype``."""
    return (x.float() * scale).to(dtype)


class ReferenceAttentionBackend(AttentionBackend):
    """Correct first: gathers each sequence's blocks and calls SDPA with an explicit mask."""

    name = "reference"

    def forward(
        self,
        query: torch.Tensor,
        key: torch.Tensor,
        value: torch.Tensor,
        kv_cache: torch.Tensor,
        metadata: AttentionBatch,
    ) -> torch.Tensor:
        num_tokens = query.shape[0]
        if kv_cache.dtype in _FP8_DTYPES and self.kv_scales.device != query.device:
            self.kv_scales = self.kv_scales.to(query.device)  # a backend built off-device
        self._write_cache(key, value, kv_cache, metadata.slot_mapping)
        if metadata.is_decode_only:
            out = self._decode(query, kv_cache, metadata)
        else:
            out = self._per_sequence(query, kv_cache, metadata)
        return out.reshape(num_tokens, self.config.num_heads * self.config.head_dim)

    def _write_cache(
        self,
        key: torch.Tensor,
        value: torch.Tensor,
        kv_cache: torch.Tensor,
        slot_mapping: torch.Tensor,
    ) -> None:
        num_kv_heads, head_dim = key.shape[1], key.shape[2]
        valid = slot_mapping[: key.shape[0]] >= 0
        slots = slot_mapping[: key.shape[0]][valid]
        if kv_cache.dtype in _FP8_DTYPES:
            k_scale, v_scale = self.kv_scales[0], self.kv_scales[1]
            key = quantize_kv(key, k_scale, kv_cache.dtype).view(torch.uint8)
            value = quantize_kv(value, v_scale, kv_cache.dtype).view(torch.uint8)
            kv_cache = kv_cache.view(torch.uint8)
        key_flat = kv_cache[0].view(-1, num_kv_heads, head_dim)
        value_flat = kv_cache[1].view(-1, num_kv_heads, head_dim)
        key_flat.index_copy_(0, slots, key[valid].to(kv_cache.dtype))
        value_flat.index_copy_(0, slots, value[valid].to(kv_cache.dtype))

    def _mask(self, query_pos: torch.Tensor, key_pos: torch.Tensor) -> torch.Tensor:
        """Bool [..., num_queries, num_keys]: causal, plus the sliding window if any."""
        mask = key_pos.unsqueeze(-2) <= query_pos.unsqueeze(-1)
        window = self.config.sliding_window
        if window is not None:
            mask &= key_pos.unsqueeze(-2) > query_pos.unsqueeze(-1) - window
        return mask

    def _attend(
        self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mask: torch.Tensor
    ) -> torch.Tensor:
        """q [B, H, Lq, D], k/v [B, KVH, Lk, D], mask bool broadcastable to [B, H, Lq, Lk]."""
        cap = self.config.logits_soft_cap
        if cap is None:
            return F.scaled_dot_product_attention(
                q, k, v, attn_mask=mask, scale=self.config.scale, enable_gqa=True
            )
        group = q.shape[1] // k.shape[1]
        k, v = k.repeat_interleave(group, dim=1), v.repeat_interleave(group, dim=1)
        scores = torch.matmul(q, k.transpose(-1, -2)) * self.config.scale
        scores = torch.tanh(scores / cap) * cap
        scores = scores.masked_fill(~mask, float("-inf"))
        probs = torch.softmax(scores, dim=-1, dtype=torch.float32).to(q.dtype)
        return torch.matmul(probs, v)

    def _gather(self, cache: torch.Tensor, block_ids: torch.Tensor) -> torch.Tensor:
        """[num_blocks_used, block_size, kv_heads, head_dim] -> [tokens, kv_heads, head_dim]."""
        gathered = cache[block_ids]
        return gathered.reshape(-1, gathered.shape[-2], gathered.shape[-1])

    def _to_query_dtype(self, kv: torch.Tensor, which: int, dtype: torch.dtype) -> torch.Tensor:
        """Gathered K (``which`` 0) or V (1) in the query dtype, dequantized if fp8."""
        if kv.dtype in _FP8_DTYPES:
            return dequantize_kv(kv, self.kv_scales[which], dtype)
        return kv.to(dtype)

    def _per_sequence(
        self, query: torch.Tensor, kv_cache: torch.Tensor, md: AttentionBatch
    ) -> torch.Tensor:
        block_size = kv_cache.shape[2]
        out = torch.zeros_like(query)
        for i in range(md.num_seqs):
            start, end = md.query_start_loc_cpu[i], md.query_start_loc_cpu[i + 1]
            seq_len = md.seq_lens_cpu[i]
            context = seq_len - (end - start)
            block_ids = md.block_tables[i, : _cdiv(seq_len, block_size)]
            k = self._to_query_dtype(self._gather(kv_cache[0], block_ids)[:seq_len], 0, query.dtype)
            v = self._to_query_dtype(self._gather(kv_cache[1], block_ids)[:seq_len], 1, query.dtype)
            device = query.device
            query_pos = torch.arange(context, seq_len, device=device)
            mask = self._mask(query_pos, torch.arange(seq_len, device=device))
            attn = self._attend(
                query[start:end].transpose(0, 1).unsqueeze(0),
                k.transpose(0, 1).unsqueeze(0),
                v.transpose(0, 1).unsqueeze(0),
                mask,
            )
            out[start:end] = attn.squeeze(0).transpose(0, 1)
        return out

    def _decode(
        self, query: torch.Tensor, kv_cache: torch.Tensor, md: AttentionBatch
    ) -> torch.Tensor:
        """One new token per sequence: pad every sequence to the longest and batch."""
        block_size = kv_cache.shape[2]
        num_seqs = md.num_seqs
        block_ids = md.block_tables[:num_seqs, : _cdiv(md.max_seq_len, block_size)]
        gathered_k, gathered_v = kv_cache[0][block_ids], kv_cache[1][block_ids]
        shape = (num_seqs, -1, gathered_k.shape[-2], gathered_k.shape[-1])
        k = self._to_query_dtype(gathered_k.reshape(shape), 0, query.dtype)
        v = self._to_query_dtype(gathered_v.reshape(shape), 1, query.dtype)
        seq_lens = md.seq_lens[:num_seqs].to(torch.long)
        key_pos = torch.arange(k.shape[1], device=query.device)
        mask = self._mask((seq_lens - 1)[:, None], key_pos[None, :])  # [num_seqs, 1, L]
        # Padded rows hold other blocks' data or never-written garbage: zero K and V there
        # so a NaN cannot leak through the additive mask or a zero probability.
        hidden = ~mask[:, 0, :, None, None]
        k, v = k.masked_fill(hidden, 0), v.masked_fill(hidden, 0)
        attn = self._attend(
            query[:num_seqs].unsqueeze(2), k.transpose(1, 2), v.transpose(1, 2), mask.unsqueeze(1)
        )
        out = torch.zeros_like(query)
        out[:num_seqs] = attn.squeeze(2)
        return out
