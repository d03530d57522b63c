"""Fused Triton layer ops against the torch reference layers (Triton interpreter on CPU)."""

from __future__ import annotations

import pytest
import torch
from engine_sdk.layers import activation, fused_ops, rotary
from engine_sdk.layers.norm import RMSNorm

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"
DTYPES = [torch.float32] + ([torch.bfloat16, torch.float16] if DEVICE == "cuda" else [])


@pytest.fixture(autouse=True)
def _force_fused(monkeypatch):
    if DEVICE == "cpu":
        monkeypatch.setenv("ENGINE_FUSED_OPS", "force")
    fused_ops._kernels.cache_clear()
    yield
    fused_ops._kernels.cache_clear()


def _tol(dtype):
    return {"atol": 1e-5, "rtol": 1e-5} if dtype == torch.float32 else {"atol": 2e-2, "rtol": 2e-2}


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("shape", [(5, 64), (3, 4, 24), (1, 1000)])
def test_rms_norm_matches_reference(shape, dtype):
    gen = torch.Generator().manual_seed(0)
    x = torch.randn(shape, generator=gen).to(dtype).to(DEVICE)
    norm = RMSNorm(shape[-1], eps=1e-6, dtype=dtype).to(DEVICE)
    norm.weight.data = torch.randn(shape[-1], generator=gen).to(dtype).to(DEVICE)
    assert fused_ops.enabled(x)
    got = norm(x)
    ref = RMSNorm.forward.__wrapped__(norm, x) if hasattr(RMSNorm.forward, "__wrapped__") else None
    # Reference: the torch path with fused ops off.
    fused_ops._kernels.cache_clear()
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("ENGINE_FUSED_OPS", "0")
        ref = norm(x)
    assert got.dtype == ref.dtype and got.shape == ref.shape
    torch.testing.assert_close(got, ref, **_tol(dtype))


@pytest.mark.parametrize("dtype", DTYPES)
def test_silu_and_mul_matches_reference(dtype):
    gen = torch.Generator().manual_seed(1)
    gate = torch.randn(7, 300, generator=gen).to(dtype).to(DEVICE) * 4
    up = torch.randn(7, 300, generator=gen).to(dtype).to(DEVICE)
    got = activation.silu_and_mul(gate, up)
    ref = torch.nn.functional.silu(gate.float()) * up.float()
    torch.testing.assert_close(got.float(), ref, **_tol(dtype))


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("head_dim,rotary_dim", [(16, 16), (24, 16), (128, 128)])
def test_rotary_matches_reference(dtype, head_dim, rotary_dim):
    gen = torch.Generator().manual_seed(2)
    num_tokens, num_heads = 6, 3
    x = torch.randn(num_tokens, num_heads, head_dim, generator=gen).to(dtype).to(DEVICE)
    freqs = torch.randn(num_tokens, rotary_dim // 2, generator=gen)
    emb = torch.cat((freqs, freqs), dim=-1)
    cos = emb.cos().to(dtype).to(DEVICE)[:, None, :]
    sin = emb.sin().to(dtype).to(DEVICE)[:, None, :]
    got = rotary.apply_rotary(x, cos, sin)
    x32, c32, s32 = x.float(), cos.float(), sin.float()
    rot, rest = x32[..., :rotary_dim], x32[..., rotary_dim:]
    x1, x2 = rot.chunk(2, dim=-1)
    ref = torch.cat((rot * c32 + torch.cat((-x2, x1), -1) * s32, rest), dim=-1)
    torch.testing.assert_close(got.float(), ref, **_tol(dtype))


def test_disabled_path_is_the_torch_reference(monkeypatch):
    monkeypatch.setenv("ENGINE_FUSED_OPS", "0")
    fused_ops._kernels.cache_clear()
    x = torch.randn(2, 8)
    assert not fused_ops.enabled(x)


@pytest.mark.parametrize("dtype", DTYPES)
def test_add_rms_norm_matches_add_then_norm(dtype):
    gen = torch.Generator().manual_seed(2)
    x = torch.randn(6, 96, generator=gen).to(dtype).to(DEVICE)
    residual = torch.randn(6, 96, generator=gen).to(dtype).to(DEVICE)
    norm = RMSNorm(96, eps=1e-6, dtype=dtype).to(DEVICE)
    norm.weight.data = torch.randn(96, generator=gen).to(dtype).to(DEVICE)
    out, summed = norm.add_forward(x, residual)
    fused_ops._kernels.cache_clear()
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("ENGINE_FUSED_OPS", "0")
        ref_out, ref_sum = norm.add_forward(x, residual)
    torch.testing.assert_close(summed, ref_sum, atol=0, rtol=0)  # one rounding, same as add
    torch.testing.assert_close(out, ref_out, **_tol(dtype))


@pytest.mark.parametrize("dtype", DTYPES)
def test_silu_and_mul_merged_matches_split(dtype):
    gen = torch.Generator().manual_seed(3)
    gate_up = torch.randn(5, 2 * 1100, generator=gen).to(dtype).to(DEVICE) * 3
    got = fused_ops.silu_and_mul_merged(gate_up)
    gate, up = gate_up.float().chunk(2, dim=-1)
    ref = torch.nn.functional.silu(gate) * up
    assert got.shape == (5, 1100)
    torch.testing.assert_close(got.float(), ref, **_tol(dtype))
    empty = fused_ops.silu_and_mul_merged(gate_up[:0])
    assert empty.shape == (0, 1100)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("qk_norm", [True, False])
@pytest.mark.parametrize("num_tokens", [1, 5])
def test_qkv_norm_rope_matches_the_separate_ops(dtype, qk_norm, num_tokens):
    """The merged q/k/v epilogue equals q/k RMSNorm + rope + contiguous split done apart
    (Qwen3: norms; Llama: rope only), including a strided qkv row (a GEMM output slice)."""
    gen = torch.Generator().manual_seed(5)
    num_q, num_kv, head_dim = 4, 2, 16
    width = (num_q + 2 * num_kv) * head_dim
    padded = torch.randn(num_tokens, width + 8, generator=gen).to(dtype).to(DEVICE) * 3
    qkv = padded[:, :width]  # row stride != width
    positions = torch.arange(7, 7 + num_tokens, device=DEVICE)
    rope = rotary.RotaryEmbedding(
        rotary.RopeParameters("default", 10000.0, head_dim, head_dim, 4096, {})
    ).to(DEVICE)
    cos, sin = rope.cos_sin(positions, dtype)
    q_norm, k_norm = (
        (RMSNorm(head_dim, 1e-6, dtype).to(DEVICE), RMSNorm(head_dim, 1e-6, dtype).to(DEVICE))
        if qk_norm
        else (None, None)
    )
    if q_norm is not None and k_norm is not None:
        q_norm.weight.data = torch.randn(head_dim, generator=gen).to(dtype).to(DEVICE)
        k_norm.weight.data = torch.randn(head_dim, generator=gen).to(dtype).to(DEVICE)
    q, k, v = fused_ops.qkv_norm_rope(
        qkv, num_q, num_kv,
        None if q_norm is None else q_norm.weight, None if k_norm is None else k_norm.weight,
        1e-6, cos, sin,
    )  # fmt: skip
    fused_ops._kernels.cache_clear()
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("ENGINE_FUSED_OPS", "0")
        q2, k2, v2 = qkv.split([num_q * head_dim, num_kv * head_dim, num_kv * head_dim], -1)
        rq = q2.reshape(num_tokens, num_q, head_dim)
        rk = k2.reshape(num_tokens, num_kv, head_dim)
        if q_norm is not None and k_norm is not None:
            rq, rk = q_norm(rq), k_norm(rk)
        rq, rk = rotary.apply_rotary(rq, cos, sin), rotary.apply_rotary(rk, cos, sin)
        rv = v2.reshape(num_tokens, num_kv, head_dim)
    for got, ref in ((q, rq), (k, rk), (v, rv)):
        assert got.is_contiguous() and got.shape == ref.shape
        torch.testing.assert_close(got, ref, **_tol(dtype))
    assert torch.equal(v, rv)


@pytest.mark.parametrize("cache", ["model", "fp8"])
@pytest.mark.parametrize("qk_norm", [True, False])
def test_qkv_norm_rope_stores_k_and_v_into_the_cache(cache, qk_norm):
    """With a ``KVStoreTarget`` the q/k/v epilogue writes k and v straight into the paged
    cache (fp8: quantized with the layer's scales, values that clip included) and returns
    no k/v: the cache then holds what the backend's own store of the separate outputs
    leaves (``store_kv_reference``), slot -1 (a padding token) writes nothing, q is the
    same."""
    from engine_sdk.interfaces.attention import KVStoreTarget
    from engine_sdk.testing.attention import store_kv_reference

    dtype = torch.bfloat16 if DEVICE == "cuda" else torch.float32
    gen = torch.Generator().manual_seed(9)
    num_tokens, num_q, num_kv, head_dim, block_size, num_blocks = 5, 4, 2, 16, 4, 6
    qkv = (torch.randn(num_tokens, (num_q + 2 * num_kv) * head_dim, generator=gen) * 3).to(dtype)
    qkv = qkv.to(DEVICE)
    rope = rotary.RotaryEmbedding(
        rotary.RopeParameters("default", 10000.0, head_dim, head_dim, 4096, {})
    ).to(DEVICE)
    cos, sin = rope.cos_sin(torch.arange(3, 3 + num_tokens, device=DEVICE), dtype)
    weights = [torch.randn(head_dim, generator=gen).to(dtype).to(DEVICE) for _ in range(2)]
    qw, kw = weights if qk_norm else (None, None)
    cache_dtype = torch.float8_e4m3fn if cache == "fp8" else dtype
    shape = (2, num_blocks, block_size, num_kv, head_dim)
    slots = torch.tensor([5, 17, -1, 0, 22], dtype=torch.int64, device=DEVICE)
    scales = torch.tensor([0.002, 0.5], device=DEVICE)  # k clips at +-448 * 0.002

    def target(kv_cache: torch.Tensor) -> KVStoreTarget:
        return KVStoreTarget(kv_cache[0], kv_cache[1], slots, scales)

    q, k, v = fused_ops.qkv_norm_rope(qkv, num_q, num_kv, qw, kw, 1e-6, cos, sin)
    assert k is not None and v is not None
    want = torch.zeros(shape, dtype=cache_dtype, device=DEVICE)
    store_kv_reference(target(want), k, v)
    got = torch.zeros(shape, dtype=cache_dtype, device=DEVICE)
    q2, k2, v2 = fused_ops.qkv_norm_rope(
        qkv, num_q, num_kv, qw, kw, 1e-6, cos, sin, kv_store=target(got)
    )
    assert k2 is None and v2 is None
    assert torch.equal(q2, q)
    assert torch.equal(got.float(), want.float())
    assert got.float().abs().sum() > 0  # something was stored
    if cache == "fp8":
        assert got[0].float().abs().max() == 448.0  # the k scale made values clip
    flat = got.view(2, -1, num_kv, head_dim)
    written = set(slots[slots >= 0].tolist())
    others = [i for i in range(num_blocks * block_size) if i not in written]
    assert not flat[:, others].float().any()  # nothing outside the slots (slot -1 skipped)
