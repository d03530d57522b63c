"""The Triton backend against a dense causal reference on random paged layouts."""

from __future__ import annotations

import math

import pytest
import torch
from engine_sdk.interfaces.attention import AttentionBatch, AttentionLayerConfig
from engine_sdk.testing.attention import (
    ATTENTION_CASES,
    FP8_ATTENTION_CASES,
    MODEL_FEATURE_ATTENTION_CASES,
    AttentionCase,
    SeqSpec,
    run_attention_case,
    run_feature_case,
)

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"


def _make_batch(ctx_lens, q_lens, block_size, num_blocks, gen):
    seq_lens = [c + q for c, q in zip(ctx_lens, q_lens, strict=True)]
    max_blocks = max(math.ceil(s / block_size) for s in seq_lens)
    perm = torch.randperm(num_blocks - 1, generator=gen) + 1  # block 0 stays unused
    tables, used = [], 0
    for s in seq_lens:
        n = math.ceil(s / block_size)
        row = perm[used : used + n].tolist()
        used += n
        tables.append(row + [0] * (max_blocks - n))
    slots = []
    for c, q, row in zip(ctx_lens, q_lens, tables, strict=True):
        for pos in range(c, c + q):
            slots.append(row[pos // block_size] * block_size + pos % block_size)
    starts = [0]
    for q in q_lens:
        starts.append(starts[-1] + q)
    batch = AttentionBatch(
        query_start_loc=torch.tensor(starts, dtype=torch.int32, device=DEVICE),
        seq_lens=torch.tensor(seq_lens, dtype=torch.int32, device=DEVICE),
        block_tables=torch.tensor(tables, dtype=torch.int32, device=DEVICE),
        slot_mapping=torch.tensor(slots, dtype=torch.int64, device=DEVICE),
        max_query_len=max(q_lens),
        max_seq_len=max(seq_lens),
        num_seqs=len(q_lens),
        num_tokens=starts[-1],
        query_start_loc_cpu=starts,
        seq_lens_cpu=seq_lens,
    )
    return batch, tables


def _run_case(ctx_lens, q_lens, num_heads, num_kv_heads, head_dim, block_size, dtype, seed):
    from engine_triton.backend import TritonAttentionBackend

    gen = torch.Generator().manual_seed(seed)
    num_blocks = (
        sum(math.ceil((c + q) / block_size) for c, q in zip(ctx_lens, q_lens, strict=True)) + 3
    )
    batch, tables = _make_batch(ctx_lens, q_lens, block_size, num_blocks, gen)
    cfg = AttentionLayerConfig(num_heads, num_kv_heads, head_dim, head_dim**-0.5, block_size, dtype)
    backend = TritonAttentionBackend(cfg)
    shape = backend.kv_cache_shape(num_blocks, block_size, num_kv_heads, head_dim)
    cache = torch.randn(shape, generator=gen).to(dtype).to(DEVICE)
    full_k, full_v = [], []
    for c, q, row in zip(ctx_lens, q_lens, tables, strict=True):
        k_all = torch.randn(c + q, num_kv_heads, head_dim, generator=gen).to(dtype).to(DEVICE)
        v_all = torch.randn(c + q, num_kv_heads, head_dim, generator=gen).to(dtype).to(DEVICE)
        for pos in range(c):  # the cached prefix is already in the pool
            cache[0, row[pos // block_size], pos % block_size] = k_all[pos]
            cache[1, row[pos // block_size], pos % block_size] = v_all[pos]
        full_k.append(k_all)
        full_v.append(v_all)
    new_k = torch.cat([k[c:] for k, c in zip(full_k, ctx_lens, strict=True)])
    new_v = torch.cat([v[c:] for v, c in zip(full_v, ctx_lens, strict=True)])
    query = torch.randn(batch.num_tokens, num_heads, head_dim, generator=gen).to(dtype)
    query = query.to(DEVICE)

    meta = backend.build_metadata(batch)
    out = backend.forward(query, new_k, new_v, cache, meta).float().cpu()

    group = num_heads // num_kv_heads
    start = 0
    for i, (c, q) in enumerate(zip(ctx_lens, q_lens, strict=True)):
        qs = query[start : start + q].float().cpu().transpose(0, 1)  # [H, q, D]
        ks = full_k[i].float().cpu().repeat_interleave(group, 1).transpose(0, 1)
        vs = full_v[i].float().cpu().repeat_interleave(group, 1).transpose(0, 1)
        mask = torch.arange(c + q)[None, :] <= (c + torch.arange(q))[:, None]
        ref = torch.nn.functional.scaled_dot_product_attention(
            qs, ks, vs, attn_mask=mask, scale=head_dim**-0.5
        )
        got = out[start : start + q].view(q, num_heads, head_dim).transpose(0, 1)
        tol = 1e-4 if dtype == torch.float32 else 2e-2
        torch.testing.assert_close(got, ref, atol=tol, rtol=tol)
        start += q
    # The new K/V landed in their slots.
    flat_k = cache[0].reshape(-1, num_kv_heads, head_dim)
    torch.testing.assert_close(flat_k[batch.slot_mapping].cpu(), new_k.cpu())


CASES = [
    # ctx_lens, q_lens, heads, kv_heads, head_dim, block_size
    ([0, 5, 17], [7, 1, 20], 4, 2, 16, 4),  # prefill, prefix + chunk, mixed
    ([0, 0], [33, 9], 8, 2, 32, 16),  # plain prefill across blocks, GQA 4
    ([40, 3, 70, 0], [1, 1, 1, 1], 4, 4, 16, 16),  # decode only, MHA
    ([31, 64], [1, 1], 6, 2, 24, 8),  # decode, head_dim not a power of two, group 3
]


@pytest.mark.parametrize("case", CASES)
def test_matches_dense_reference_fp32(case):
    _run_case(*case, dtype=torch.float32, seed=hash(str(case)) % 1000)


@pytest.mark.skipif(DEVICE != "cuda", reason="half precision dots need the GPU")
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
@pytest.mark.parametrize("case", CASES)
def test_matches_dense_reference_half(case, dtype):
    _run_case(*case, dtype=dtype, seed=7)


# Split KV decode: every split count, contexts shorter than, equal to and longer than a
# split's chunk, a window, and fp8 caches; the split count is forced through the target.
_SPLIT_DECODE_CASES = (
    AttentionCase(
        "split_decode",
        (SeqSpec((150, 1, 1)), SeqSpec((3, 1)), SeqSpec((64, 1, 1)), SeqSpec((0, 1))),
    ),
    AttentionCase(
        "split_decode_window", (SeqSpec((150, 1, 1)), SeqSpec((9, 1))), sliding_window=20
    ),
)


_FP8_DECODE_CASES = [c for c in FP8_ATTENTION_CASES if "decode" in c.name]


@pytest.mark.parametrize("splits", [1, 2, 4, 16])
@pytest.mark.parametrize("case", [*_SPLIT_DECODE_CASES, *_FP8_DECODE_CASES], ids=lambda c: c.name)
def test_split_kv_decode(case, splits, monkeypatch):
    from engine_triton import backend as triton_backend

    monkeypatch.setattr(triton_backend, "MAX_KV_SPLITS", splits)
    monkeypatch.setattr(triton_backend, "SPLIT_PROGRAMS_PER_SM", 10**6)  # always the maximum
    seen = []
    build = triton_backend.TritonAttentionBackend.build_metadata

    def recording_build(self, batch):
        meta = build(self, batch)
        seen.append((batch.is_decode_only, meta.kv_splits))
        return meta

    monkeypatch.setattr(triton_backend.TritonAttentionBackend, "build_metadata", recording_build)
    dtype = torch.bfloat16 if DEVICE == "cuda" else torch.float32
    run_attention_case(triton_backend.TritonAttentionBackend, case, device=DEVICE, dtype=dtype)
    decode_splits = {s for decode, s in seen if decode}
    assert decode_splits == {splits}, seen  # the decode steps ran split that many ways
    assert {s for decode, s in seen if not decode} <= {1}


@pytest.mark.parametrize("group", [1, 3])
def test_split_decode_merges_in_the_same_launch(group, monkeypatch):
    """Split decode: the last split of each (sequence, KV head) merges the parts inside
    the attention launch (no combine launch), with the same numbers as the two-launch
    path, and leaves every counter at zero for the next launch (and a graph replay)."""
    from engine_triton import backend as triton_backend

    monkeypatch.setattr(triton_backend, "MAX_KV_SPLITS", 4)
    monkeypatch.setattr(triton_backend, "SPLIT_PROGRAMS_PER_SM", 10**6)
    gen = torch.Generator().manual_seed(5)
    ctx_lens, block_size, num_kv_heads, head_dim = [150, 3, 64, 0], 8, 2, 32
    num_blocks = sum(math.ceil((c + 1) / block_size) for c in ctx_lens) + 3
    batch, _ = _make_batch(ctx_lens, [1] * 4, block_size, num_blocks, gen)
    num_heads = num_kv_heads * group
    cfg = AttentionLayerConfig(
        num_heads, num_kv_heads, head_dim, head_dim**-0.5, block_size, torch.float32
    )
    backend = triton_backend.TritonAttentionBackend(cfg)
    shape = backend.kv_cache_shape(num_blocks, block_size, num_kv_heads, head_dim)
    cache = torch.randn(shape, generator=gen).to(DEVICE)
    query = torch.randn(4, num_heads, head_dim, generator=gen).to(DEVICE)
    new_k = torch.randn(4, num_kv_heads, head_dim, generator=gen).to(DEVICE)
    new_v = torch.randn(4, num_kv_heads, head_dim, generator=gen).to(DEVICE)
    meta = backend.build_metadata(batch)
    assert meta.kv_splits == 4

    two_launch = triton_backend.combine_splits_kernel
    monkeypatch.setattr(triton_backend, "COMBINE_IN_KERNEL", False)
    want = backend.forward(query, new_k, new_v, cache.clone(), meta)
    assert not backend._locks  # the two-launch path uses no counters

    class NoCombineLaunch:
        def __getitem__(self, grid):
            raise AssertionError("the split parts were merged by a second launch")

    monkeypatch.setattr(triton_backend, "combine_splits_kernel", NoCombineLaunch())
    monkeypatch.setattr(triton_backend, "COMBINE_IN_KERNEL", True)
    for _ in range(2):  # the second launch finds the counters the first one left at zero
        got = backend.forward(query, new_k, new_v, cache.clone(), meta)
        if DEVICE == "cpu":  # the interpreter: the same float32 operations in the same order
            assert torch.equal(got, want)
        else:  # compiled, the merge's multiply-adds may contract differently (an H100: ulps)
            torch.testing.assert_close(got, want, atol=1e-6, rtol=1e-5)
        assert len(backend._locks) == 1 and not backend._locks[0].any()
    assert two_launch is not triton_backend.combine_splits_kernel


@pytest.mark.parametrize(
    "case", [*ATTENTION_CASES, *_SPLIT_DECODE_CASES, *_FP8_DECODE_CASES], ids=lambda c: c.name
)
def test_conformance_with_kv_stored_by_the_caller(case):
    """The SDK suite with each step's K/V written through ``kv_store_target`` (as the
    decoder's fused q/k/v kernel does) and ``forward_stored``: the target is the cache the
    backend reads, fp8 scales included."""
    from engine_triton.backend import TritonAttentionBackend

    dtype = torch.bfloat16 if DEVICE == "cuda" else torch.float32
    run_attention_case(TritonAttentionBackend, case, device=DEVICE, dtype=dtype, stored_kv=True)


def test_kv_splits_reach_the_program_target():
    from engine_triton.backend import MAX_KV_SPLITS, kv_splits

    assert kv_splits(1, 8, 132) == MAX_KV_SPLITS  # batch 1: split as far as allowed
    assert kv_splits(16, 8, 132) == 4  # 16 x 8 x 4 = 512 >= 2 x 132 programs
    assert kv_splits(64, 8, 132) == 1  # the batch alone fills the GPU


# -- the SDK conformance suite, and the fp8 KV cache ----------------------------------------

# Windows far shorter than the context, so whole key tiles (64 tokens) are skipped: a
# prefill chunk after a long context, decode past it, and a window smaller than a tile.
_LONG_WINDOW_CASES = (
    AttentionCase(
        "long_context_window",
        (SeqSpec((150, 1, 1)), SeqSpec((70, 60, 1)), SeqSpec((0, 130, 2))),
        sliding_window=20,
    ),
    AttentionCase("window_of_one", (SeqSpec((80, 1)), SeqSpec((9, 70))), sliding_window=1),
)
_SUITE_CASES = [*ATTENTION_CASES, *_LONG_WINDOW_CASES]


@pytest.mark.parametrize("case", _SUITE_CASES, ids=lambda c: c.name)
def test_conformance(case):
    from engine_triton.backend import TritonAttentionBackend

    dtype = torch.bfloat16 if DEVICE == "cuda" else torch.float32
    run_attention_case(TritonAttentionBackend, case, device=DEVICE, dtype=dtype)


@pytest.mark.parametrize("case", MODEL_FEATURE_ATTENTION_CASES, ids=lambda c: c.name)
def test_model_feature_cases_are_computed(case):
    """Soft cap, head_dim 96 / 256, Gemma's local and global layers: computed, not refused."""
    from engine_triton.backend import TritonAttentionBackend

    dtype = torch.bfloat16 if DEVICE == "cuda" else torch.float32
    assert run_feature_case(TritonAttentionBackend, case, device=DEVICE, dtype=dtype) is None


@pytest.mark.parametrize("case", FP8_ATTENTION_CASES, ids=lambda c: c.name)
def test_conformance_fp8_kv_cache(case):
    from engine_triton.backend import TritonAttentionBackend

    dtype = torch.bfloat16 if DEVICE == "cuda" else torch.float32
    run_attention_case(TritonAttentionBackend, case, device=DEVICE, dtype=dtype)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_fp8_store_matches_torch_quantization(dtype):
    """The store kernel writes exactly fp8(clamp(x / scale)), with x / scale correctly
    rounded (bf16 inputs over a scale like 0.03 often land next to an fp8 midpoint, where
    an approximate division rounds the other way) and then round to nearest even."""
    from engine_triton.backend import TritonAttentionBackend

    gen = torch.Generator().manual_seed(5)
    tokens = 96
    batch, _ = _make_batch([0], [tokens], 16, 8, gen)
    cfg = AttentionLayerConfig(4, 2, 32, 32**-0.5, 16, dtype, kv_cache_dtype="fp8")
    backend = TritonAttentionBackend(cfg)
    backend.set_kv_scales(0.01, 0.03)
    key = (torch.randn(tokens, 2, 32, generator=gen) * 2).to(dtype).to(DEVICE)  # some clip
    value = torch.randn(tokens, 2, 32, generator=gen).to(dtype).to(DEVICE)
    query = torch.randn(tokens, 4, 32, generator=gen).to(dtype).to(DEVICE)
    cache = torch.zeros(2, 8, 16, 2, 32, dtype=torch.float8_e4m3fn, device=DEVICE)
    backend.forward(query, key, value, cache, backend.build_metadata(batch))
    flat = cache.view(torch.uint8).reshape(2, -1, 2, 32)[:, batch.slot_mapping]

    def quantize(x: torch.Tensor, scale: float) -> torch.Tensor:
        divisor = torch.tensor(scale, dtype=torch.float32, device=x.device)  # true division
        return (x.float() / divisor).clamp(-448, 448).to(torch.float8_e4m3fn)

    assert (key.abs() > 4.48).any()
    assert torch.equal(flat[0], quantize(key, 0.01).view(torch.uint8))
    assert torch.equal(flat[1], quantize(value, 0.03).view(torch.uint8))


def test_rejects_kv_cache_dtypes_it_cannot_run():
    from engine_triton.backend import TritonAttentionBackend

    cfg = AttentionLayerConfig(4, 2, 16, 0.25, 16, torch.float32, kv_cache_dtype="fp8_e5m2")
    with pytest.raises(ValueError, match="--kv-cache-dtype 'fp8_e5m2'.*reference"):
        TritonAttentionBackend(cfg)


def test_spec_declares_fp8_kv_cache():
    import engine_triton.plugin

    (spec,) = engine_triton.plugin.register_attention_backends()
    assert set(spec.kv_cache_dtypes) == {"auto", "fp8", "fp8_e4m3"}


def test_prefill_work_runs_heaviest_query_blocks_first():
    """Every (sequence, query block) is launched once, ordered by KV positions attended."""
    from engine_triton import backend as backend_mod

    ctx_lens, q_lens = [0, 100, 5], [130, 40, 1]
    batch, _ = _make_batch(ctx_lens, q_lens, 16, 40, torch.Generator().manual_seed(0))
    cfg = AttentionLayerConfig(4, 2, 16, 0.25, 16, torch.float32)
    meta = backend_mod.TritonAttentionBackend(cfg).build_metadata(batch)
    seqs, blocks = meta.work_seq.cpu().tolist(), meta.work_qblock.cpu().tolist()
    expected = {(s, b) for s, q in enumerate(q_lens) for b in range(-(-q // meta.block_q))}
    assert len(seqs) == meta.num_work == len(expected)
    assert set(zip(seqs, blocks, strict=True)) == expected
    cost = [
        ctx_lens[s] + min((b + 1) * meta.block_q, q_lens[s])
        for s, b in zip(seqs, blocks, strict=True)
    ]
    assert cost == sorted(cost, reverse=True)
    assert cost[0] > cost[-1]


@pytest.mark.parametrize("splits", [1, 4])
def test_decode_launches_name_every_constexpr(splits, monkeypatch):
    """The decode step's attention launches (KV store, attention; split or not) name every
    constexpr, defaults included, as torch.compile's launchers need
    (``engine_sdk.testing.launches``). Triton's interpreter: CPU only."""
    if DEVICE == "cuda":
        pytest.skip("records the interpreter's launches")
    from engine_sdk.testing.launches import recorded_launches
    from engine_triton import backend as triton_backend

    monkeypatch.setattr(triton_backend, "MAX_KV_SPLITS", splits)
    monkeypatch.setattr(triton_backend, "SPLIT_PROGRAMS_PER_SM", 10**6)
    with recorded_launches() as seen:
        run_attention_case(
            triton_backend.TritonAttentionBackend, _SPLIT_DECODE_CASES[0], device=DEVICE,
            dtype=torch.float32,
        )  # fmt: skip
    assert seen.kernels
    assert seen.unpassed == set(), seen.unpassed
