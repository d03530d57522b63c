"""A dense attention backend for SDK tests: each sequence's cached K/V gathered through its
block table and one causal ``scaled_dot_product_attention`` (GQA, the layer's scale,
sliding window and soft cap). Correct and slow; it lets the SDK's testing kit run a model
with ``engine-sdk`` alone, without any attention-backend plugin installed.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from engine_sdk.interfaces.attention import AttentionBackend, AttentionBatch

__all__ = ["DenseAttentionBackend"]


class DenseAttentionBackend(AttentionBackend):
    name = "sdk-dense"

    def forward(
        self,
        query: torch.Tensor,
        key: torch.Tensor,
        value: torch.Tensor,
        kv_cache: torch.Tensor,
        metadata: AttentionBatch,
    ) -> torch.Tensor:
        cfg = self.config
        slots = metadata.slot_mapping[: key.shape[0]]
        valid = slots >= 0
        for cache, new in ((kv_cache[0], key), (kv_cache[1], value)):  # in the cache's dtype
            cache.view(-1, *new.shape[1:]).index_copy_(0, slots[valid], new[valid].to(cache.dtype))
        block_size = kv_cache.shape[2]
        out = torch.zeros_like(query)
        for i in range(metadata.num_seqs):
            start, end = metadata.query_start_loc_cpu[i], metadata.query_start_loc_cpu[i + 1]
            seq_len = metadata.seq_lens_cpu[i]
            blocks = metadata.block_tables[i, : -(-seq_len // block_size)]
            k = kv_cache[0][blocks].reshape(-1, *key.shape[1:])[:seq_len].to(query.dtype)
            v = kv_cache[1][blocks].reshape(-1, *value.shape[1:])[:seq_len].to(query.dtype)
            q_pos = torch.arange(seq_len - (end - start), seq_len, device=query.device)
            k_pos = torch.arange(seq_len, device=query.device)
            mask = k_pos[None, :] <= q_pos[:, None]
            if cfg.sliding_window is not None:
                mask &= k_pos[None, :] > q_pos[:, None] - cfg.sliding_window
            group = cfg.num_heads // cfg.num_kv_heads
            q_h = query[start:end].transpose(0, 1)  # [H, Lq, D]
            k_h = k.transpose(0, 1).repeat_interleave(group, 0)  # [H, Lk, D]
            v_h = v.transpose(0, 1).repeat_interleave(group, 0)
            if cfg.logits_soft_cap is None:
                attn = F.scaled_dot_product_attention(
                    q_h, k_h, v_h, attn_mask=mask, scale=cfg.scale
                )
            else:
                cap = cfg.logits_soft_cap
                scores = torch.tanh(q_h @ k_h.transpose(-1, -2) * cfg.scale / cap) * cap
                probs = scores.masked_fill(~mask, float("-inf")).softmax(-1)
                attn = probs @ v_h
            out[start:end] = attn.transpose(0, 1)
        return out.reshape(query.shape[0], cfg.num_heads * cfg.head_dim)
