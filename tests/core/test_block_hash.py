"""Prefix-cache block hashes: canonical encoding, chaining, extra keys, both algorithms."""

from __future__ import annotations

import hashlib
import struct

import pytest
import xxhash
from engine.core.kv_cache import KVCacheConfig, get_hash_fn, hash_block_tokens
from engine.core.kv_cache.block_hash import encode_extra_keys


def _expected_bytes(parent: bytes, tokens: list[int], lora: str | None, salt: str | None) -> bytes:
    def key(v: str | None) -> bytes:
        if v is None:
            return b"\x00"
        raw = v.encode()
        return b"\x01" + struct.pack("<I", len(raw)) + raw

    return (
        bytes([len(parent)])
        + parent
        + struct.pack("<I", len(tokens))
        + b"".join(struct.pack("<q", t) for t in tokens)
        + key(lora)
        + key(salt)
    )


def test_sha256_is_the_documented_canonical_encoding() -> None:
    sha = get_hash_fn("sha256")
    first = hash_block_tokens(sha, None, [1, 2, 3, 4], encode_extra_keys(None, None))
    assert first == hashlib.sha256(_expected_bytes(b"", [1, 2, 3, 4], None, None)).digest()
    second = hash_block_tokens(sha, first, [5, 6, 7, 2**40], encode_extra_keys("lora-a", "s"))
    expected = hashlib.sha256(_expected_bytes(first, [5, 6, 7, 2**40], "lora-a", "s")).digest()
    assert second == expected
    assert len(first) == 32


def test_xxhash_is_xxh3_128_and_differs_from_sha256() -> None:
    xx = get_hash_fn("xxhash")
    sha = get_hash_fn("sha256")
    data = _expected_bytes(b"", [9, 8, 7, 6], None, None)
    h_xx = hash_block_tokens(xx, None, [9, 8, 7, 6])
    assert h_xx == xxhash.xxh3_128_digest(data)
    assert len(h_xx) == 16
    assert h_xx != hash_block_tokens(sha, None, [9, 8, 7, 6])


@pytest.mark.parametrize("algo", ["sha256", "xxhash"])
def test_hash_depends_on_parent_tokens_and_extra_keys(algo: str) -> None:
    fn = get_hash_fn(algo)
    base = hash_block_tokens(fn, None, [1, 2, 3, 4])
    assert base == hash_block_tokens(fn, None, [1, 2, 3, 4])  # deterministic
    other_parent = hash_block_tokens(fn, None, [1, 2, 3, 5])
    variants = {
        base,
        other_parent,
        hash_block_tokens(fn, base, [1, 2, 3, 4]),
        hash_block_tokens(fn, other_parent, [1, 2, 3, 4]),
        hash_block_tokens(fn, None, [1, 2, 3, 4], encode_extra_keys("a", None)),
        hash_block_tokens(fn, None, [1, 2, 3, 4], encode_extra_keys(None, "a")),
        hash_block_tokens(fn, None, [1, 2, 3, 4], encode_extra_keys("a", "a")),
        hash_block_tokens(fn, None, [1, 2, 3, 4], encode_extra_keys("", None)),
        # the length prefix keeps ("ab", None) and ("a", "b")-style splits apart
        hash_block_tokens(fn, None, [1, 2, 3, 4], encode_extra_keys("ab", None)),
    }
    assert len(variants) == 9


def test_unknown_algo_names_the_flag() -> None:
    with pytest.raises(ValueError, match="--prefix-caching-hash-algo"):
        get_hash_fn("md5")
    with pytest.raises(ValueError, match="--prefix-caching-hash-algo"):
        KVCacheConfig(num_blocks=8, block_size=4, hash_algo="md5")


def test_kv_cache_config_validation() -> None:
    with pytest.raises(ValueError, match="--block-size"):
        KVCacheConfig(num_blocks=8, block_size=0)
    with pytest.raises(ValueError, match="null block"):
        KVCacheConfig(num_blocks=1, block_size=4)
    assert KVCacheConfig(num_blocks=8, block_size=4).num_usable_blocks == 7
