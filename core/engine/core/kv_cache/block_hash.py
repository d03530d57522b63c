"""Prefix-cache block hashes: a chain over (parent hash, block tokens, extra keys).

A full block's hash commits to every token before it (through the parent hash) and to the
extra keys that make equal tokens mean different KV: the adapter id (``lora_id``) and the
request's ``cache_salt``. The bytes hashed are a canonical encoding (fixed-width
little-endian token ids, length-prefixed strings), never pickle, so hashes are stable across
processes and Python versions:

    [len(parent)][parent bytes][num_tokens:u32][token:i64 ...][lora key][salt key]
    key = 0x00 (none) | 0x01 [len:u32][utf-8 bytes]
"""

from __future__ import annotations

import hashlib
import struct
from collections.abc import Callable, Sequence
from typing import NewType

BlockHash = NewType("BlockHash", bytes)
HashFn = Callable[[bytes], bytes]

HASH_ALGOS = ("sha256", "xxhash")


def _sha256(data: bytes) -> bytes:
    return hashlib.sha256(data).digest()


def get_hash_fn(algo: str) -> HashFn:
    """The digest function for ``--prefix-caching-hash-algo`` (sha256 or xxhash's xxh3_128)."""
    if algo == "sha256":
        return _sha256
    if algo == "xxhash":
        try:
            import xxhash
        except ImportError as e:  # pragma: no cover - xxhash is a core dependency
            raise ValueError(
                "--prefix-caching-hash-algo xxhash needs the xxhash package: "
                "pip install xxhash, or use --prefix-caching-hash-algo sha256"
            ) from e
        digest: HashFn = xxhash.xxh3_128_digest
        return digest
    raise ValueError(
        f"--prefix-caching-hash-algo must be one of {', '.join(HASH_ALGOS)}; got {algo!r}"
    )


def _encode_key(value: str | None) -> bytes:
    if value is None:
        return b"\x00"
    raw = value.encode("utf-8")
    return b"\x01" + len(raw).to_bytes(4, "little") + raw


def encode_extra_keys(lora_id: str | None, cache_salt: str | None) -> bytes:
    """The extra-key suffix of every block of one request (computed once per request)."""
    return _encode_key(lora_id) + _encode_key(cache_salt)


def hash_block_tokens(
    hash_fn: HashFn,
    parent_hash: BlockHash | None,
    token_ids: Sequence[int],
    extra_keys: bytes = b"\x00\x00",
) -> BlockHash:
    """Hash one full block; ``parent_hash`` is None for a request's first block."""
    parent = parent_hash or b""
    num_tokens = len(token_ids)
    data = b"".join(
        (
            len(parent).to_bytes(1, "little"),
            parent,
            num_tokens.to_bytes(4, "little"),
            struct.pack(f"<{num_tokens}q", *token_ids),
            extra_keys,
        )
    )
    return BlockHash(hash_fn(data))
