"""Paged KV cache bookkeeping: block pool, prefix-cache hashing and the per-request manager.

Plain Python, no torch: the runner owns the tensors; this package only decides which block
ids each request's tokens live in.
"""

from engine.core.kv_cache.block_hash import BlockHash, HashFn, get_hash_fn, hash_block_tokens
from engine.core.kv_cache.block_pool import NULL_BLOCK_ID, BlockPool
from engine.core.kv_cache.kv_cache_block import KVCacheBlock
from engine.core.kv_cache.kv_cache_config import KVCacheConfig
from engine.core.kv_cache.kv_cache_manager import KVCacheManager

__all__ = [
    "NULL_BLOCK_ID",
    "BlockHash",
    "BlockPool",
    "HashFn",
    "KVCacheBlock",
    "KVCacheConfig",
    "KVCacheManager",
    "get_hash_fn",
    "hash_block_tokens",
]
