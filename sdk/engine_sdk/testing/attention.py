"""Conformance suite for attention backends: paged attention against a dense reference.

Every case runs a few engine steps over several sequences with random q/k/v, random
(non-contiguous) block tables and a cache pre-filled with NaN, then compares each step's
output with dense causal attention computed in float64 from the full sequences. Cases
cover single-step prefill, chunked prefill, decode (batched and mixed with prefill), a
prefix shared through the block table (its K/V written by another sequence), GQA / MQA /
MHA, padding tokens (slot -1) and sliding windows.

``MODEL_FEATURE_ATTENTION_CASES`` are what Gemma and Phi-3 layers need: logit soft-capping,
a scale other than ``head_dim ** -0.5`` (``query_pre_attn_scalar``), head_dim 96 and 256,
and the sliding-window and global layers of one model (each layer has its own config, so
its own window). ``run_feature_case`` accepts a backend that refuses a case at construction
with a ``ValueError`` naming the case's ``feature``; anything else must match.

``FP8_ATTENTION_CASES`` run the same steps with an fp8 KV cache (``kv_cache_dtype`` fp8,
per-layer ``k_scale`` / ``v_scale`` set through ``AttentionBackend.set_kv_scales``). Their
reference uses K and V rounded the way the cache stores them
(``fp8(clamp(x / scale)) * scale``), so the tolerance stays the query dtype's: what is
checked is that the backend quantizes on write, dequantizes on read and applies the scales,
not how much fp8 costs. One case uses scales small enough that values clip at +-448.

Use it from a backend's tests::

    from engine_sdk.testing.attention import ATTENTION_CASES, run_attention_case

    @pytest.mark.parametrize("case", ATTENTION_CASES, ids=lambda c: c.name)
    def test_conformance(case):
        run_attention_case(MyBackend, case, device="cuda", dtype=torch.bfloat16)

A step's sequences are those with a non-zero entry at that step in ``SeqSpec.steps``::

    steps   seq0: (20, 17, 1)   seq1: (0, 6, 1)    -> step 0: seq0 20 tokens
                                                     step 1: seq0 17, seq1 6  (mixed)
                                                     step 2: seq0 1, seq1 1   (decode)
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import torch

from engine_sdk.interfaces.attention import (
    FP8_KV_CACHE_DTYPES,
    AttentionBackend,
    AttentionBatch,
    AttentionLayerConfig,
    KVStoreTarget,
)

__all__ = [
    "ATTENTION_CASES",
    "FP8_ATTENTION_CASES",
    "MODEL_FEATURE_ATTENTION_CASES",
    "AttentionCase",
    "SeqSpec",
    "check_attention_backend",
    "dense_causal_attention",
    "fake_quantize_kv",
    "store_kv_reference",
    "run_attention_case",
    "run_feature_case",
]


@dataclass(frozen=True)
class SeqSpec:
    """One sequence: tokens scheduled per step (0 = idle) and an optional shared prefix.

    With ``prefix_from`` set, the sequence's first ``num_prefix_blocks`` blocks are the
    same physical blocks as sequence ``prefix_from``'s (which must have written them in an
    earlier step); its own tokens start right after the prefix.
    """

    steps: tuple[int, ...]
    prefix_from: int | None = None
    num_prefix_blocks: int = 0


@dataclass(frozen=True)
class AttentionCase:
    name: str
    seqs: tuple[SeqSpec, ...]
    num_heads: int = 4
    num_kv_heads: int = 2
    head_dim: int = 16
    block_size: int = 16
    sliding_window: int | None = None
    num_padding_tokens: int = 0  # appended to every step with slot -1
    num_extra_blocks: int = 3  # unused blocks, so ids are not just 0..n-1
    kv_cache_dtype: str = "auto"  # or an fp8 name of FP8_KV_CACHE_DTYPES
    k_scale: float = 1.0  # fp8 cache scales (real = stored * scale)
    v_scale: float = 1.0
    logits_soft_cap: float | None = None
    scale: float | None = None  # None: head_dim ** -0.5
    feature: str = ""  # the AttentionLayerConfig field a backend may refuse this case by

    @property
    def num_steps(self) -> int:
        return max(len(s.steps) for s in self.seqs)


ATTENTION_CASES: tuple[AttentionCase, ...] = (
    AttentionCase("prefill_one_step", (SeqSpec((37,)),)),
    AttentionCase("prefill_batch", (SeqSpec((37,)), SeqSpec((5,)), SeqSpec((16,)))),
    AttentionCase("chunked_prefill", (SeqSpec((20, 17, 5)),)),
    AttentionCase("decode_batched", (SeqSpec((40, 1, 1, 1)), SeqSpec((3, 1, 1, 1)))),
    AttentionCase(
        "mixed_prefill_and_decode",
        (SeqSpec((20, 1, 1, 1)), SeqSpec((0, 33, 1, 1)), SeqSpec((0, 0, 7, 1))),
    ),
    AttentionCase(
        "shared_prefix",
        (SeqSpec((32, 1, 1)), SeqSpec((0, 10, 1), prefix_from=0, num_prefix_blocks=2)),
    ),
    AttentionCase("mha", (SeqSpec((19, 1, 1)), SeqSpec((9, 4, 1))), num_heads=4, num_kv_heads=4),
    AttentionCase("mqa", (SeqSpec((19, 1, 1)), SeqSpec((9, 4, 1))), num_heads=4, num_kv_heads=1),
    AttentionCase("gqa_8_2", (SeqSpec((19, 1, 1)), SeqSpec((9, 4, 1))), num_heads=8),
    AttentionCase("block_size_1", (SeqSpec((5, 3, 1)), SeqSpec((2, 1, 1))), block_size=1),
    AttentionCase(
        "padding_tokens", (SeqSpec((12, 1, 1)), SeqSpec((4, 1, 1))), num_padding_tokens=3
    ),
    AttentionCase(
        "sliding_window", (SeqSpec((30, 9, 1, 1)), SeqSpec((5, 1, 1, 1))), sliding_window=8
    ),
)

FP8_ATTENTION_CASES: tuple[AttentionCase, ...] = (
    AttentionCase(
        "fp8_prefill_batch",
        (SeqSpec((37,)), SeqSpec((5,)), SeqSpec((16,))),
        kv_cache_dtype="fp8",
        k_scale=0.02,
        v_scale=0.03,
    ),
    AttentionCase(
        "fp8_mixed_prefill_and_decode",
        (SeqSpec((20, 1, 1, 1)), SeqSpec((0, 33, 1, 1)), SeqSpec((0, 0, 7, 1))),
        kv_cache_dtype="fp8",
        k_scale=0.05,
        v_scale=0.01,
    ),
    AttentionCase(
        "fp8_shared_prefix",
        (SeqSpec((32, 1, 1)), SeqSpec((0, 10, 1), prefix_from=0, num_prefix_blocks=2)),
        kv_cache_dtype="fp8",
        k_scale=0.02,
        v_scale=0.02,
    ),
    AttentionCase(
        "fp8_gqa_decode_padding",
        (SeqSpec((19, 1, 1)), SeqSpec((9, 4, 1))),
        num_heads=8,
        num_padding_tokens=2,
        kv_cache_dtype="fp8",
        k_scale=0.03,
        v_scale=0.04,
    ),
    # Unit scales, as when a checkpoint has none: small values land in fp8 subnormals.
    AttentionCase(
        "fp8_unit_scales", (SeqSpec((24, 1, 1)), SeqSpec((3, 1, 1))), kv_cache_dtype="fp8"
    ),
    # |x| > 448 * scale (about 2 standard deviations) clips.
    AttentionCase(
        "fp8_clipped",
        (SeqSpec((21, 1, 1)), SeqSpec((6, 2, 1))),
        kv_cache_dtype="fp8",
        k_scale=0.005,
        v_scale=0.004,
    ),
)

# Soft caps small enough that the tanh bends the random (std ~1) scores.
MODEL_FEATURE_ATTENTION_CASES: tuple[AttentionCase, ...] = (
    AttentionCase(
        "soft_cap",
        (SeqSpec((21, 6, 1, 1)), SeqSpec((0, 9, 1, 1))),
        logits_soft_cap=1.5,
        feature="logits_soft_cap",
    ),
    AttentionCase(
        "head_dim_96",
        (SeqSpec((19, 5, 1)), SeqSpec((3, 1, 1))),
        num_heads=4,
        num_kv_heads=4,
        head_dim=96,
        feature="head_dim",
    ),
    # A Gemma 2 local layer: head_dim 256, window, soft cap, query_pre_attn_scalar 224.
    AttentionCase(
        "gemma_local_layer",
        (SeqSpec((30, 9, 1, 1)), SeqSpec((5, 1, 1, 1))),
        num_heads=4,
        num_kv_heads=2,
        head_dim=256,
        sliding_window=8,
        logits_soft_cap=2.0,
        scale=224**-0.5,
        feature="head_dim",
    ),
    # ... and its global layer: the same shapes, no window.
    AttentionCase(
        "gemma_global_layer",
        (SeqSpec((30, 9, 1, 1)), SeqSpec((5, 1, 1, 1))),
        num_heads=4,
        num_kv_heads=2,
        head_dim=256,
        logits_soft_cap=2.0,
        scale=224**-0.5,
        feature="head_dim",
    ),
)

_TOLERANCES = {torch.float32: 2e-4, torch.float16: 5e-3, torch.bfloat16: 3e-2}


def dense_causal_attention(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    scale: float,
    sliding_window: int | None = None,
    logits_soft_cap: float | None = None,
) -> torch.Tensor:
    """Plain causal attention in float64. q [L, H, D], k/v [L, KVH, D] -> [L, H, D]."""
    num_heads, num_kv_heads = q.shape[1], k.shape[1]
    rep = num_heads // num_kv_heads
    q64 = q.double().transpose(0, 1)
    k64 = k.double().repeat_interleave(rep, dim=1).transpose(0, 1)
    v64 = v.double().repeat_interleave(rep, dim=1).transpose(0, 1)
    scores = q64 @ k64.transpose(1, 2) * scale
    if logits_soft_cap is not None:
        scores = torch.tanh(scores / logits_soft_cap) * logits_soft_cap
    pos = torch.arange(q.shape[0], device=q.device)
    allowed = pos[None, :] <= pos[:, None]
    if sliding_window is not None:
        allowed &= pos[None, :] > pos[:, None] - sliding_window
    scores = scores.masked_fill(~allowed, float("-inf"))
    return (scores.softmax(-1) @ v64).transpose(0, 1)


def fake_quantize_kv(x: torch.Tensor, scale: float, fp8_dtype: torch.dtype) -> torch.Tensor:
    """What an fp8 cache gives back for ``x``: ``fp8(clamp(x / scale)) * scale`` (float64)."""
    limit = torch.finfo(fp8_dtype).max
    # The divisor lives on x's device: a 0-dim CPU tensor would be a "CPU scalar" to a CUDA
    # op, which multiplies by its reciprocal instead of dividing, and bf16 inputs often sit
    # where that rounds to the neighbouring fp8 value.
    divisor = torch.tensor(scale, dtype=torch.float32, device=x.device)
    stored = (x.float() / divisor).clamp(-limit, limit)
    return stored.to(fp8_dtype).double() * scale


def store_kv_reference(target: KVStoreTarget, key: torch.Tensor, value: torch.Tensor) -> None:
    """Write ``key``/``value`` [num_tokens, num_kv_heads, head_dim] where ``target`` says
    (``KVStoreTarget``'s contract, in torch): what a fused kernel must leave in the cache."""
    slots = target.slot_mapping.long()
    keep = slots >= 0
    for cache, x, index in ((target.k_cache, key, 0), (target.v_cache, value, 1)):
        flat = cache.view(-1, *cache.shape[2:])
        x = x[keep]
        if cache.dtype != x.dtype:  # fp8: the store's quantization (IEEE division on device)
            limit = torch.finfo(cache.dtype).max
            scale = target.kv_scales[index].to(torch.float32)
            flat[slots[keep]] = (x.float() / scale).clamp(-limit, limit).to(cache.dtype)
        else:
            flat[slots[keep]] = x


def _cache_dtype(case: AttentionCase, dtype: torch.dtype) -> torch.dtype:
    if case.kv_cache_dtype == "auto":
        return dtype
    if case.kv_cache_dtype not in FP8_KV_CACHE_DTYPES:
        raise ValueError(
            f"case {case.name}: kv_cache_dtype {case.kv_cache_dtype!r} is not one of "
            f"auto, {', '.join(FP8_KV_CACHE_DTYPES)}"
        )
    cache_dtype: torch.dtype = getattr(torch, FP8_KV_CACHE_DTYPES[case.kv_cache_dtype])
    return cache_dtype


@dataclass
class _Seq:
    spec: SeqSpec
    q: torch.Tensor
    k: torch.Tensor
    v: torch.Tensor
    block_ids: list[int] = field(default_factory=list)
    num_computed: int = 0


def _make_sequences(
    case: AttentionCase, dtype: torch.dtype, device: str, gen: torch.Generator
) -> tuple[list[_Seq], int]:
    """Random q/k/v per sequence and a shuffled assignment of physical blocks."""
    seqs: list[_Seq] = []
    bs = case.block_size
    lengths = []
    for spec in case.seqs:
        lengths.append(spec.num_prefix_blocks * bs + sum(spec.steps))
    own_blocks = [
        math.ceil(length / bs) - spec.num_prefix_blocks
        for length, spec in zip(lengths, case.seqs, strict=True)
    ]
    num_blocks = sum(own_blocks) + case.num_extra_blocks
    free = torch.randperm(num_blocks, generator=gen).tolist()
    for spec, length, n_own in zip(case.seqs, lengths, own_blocks, strict=True):

        def rand(heads: int, length: int = length) -> torch.Tensor:
            x = torch.randn(length, heads, case.head_dim, generator=gen)
            return x.to(device=device, dtype=dtype)

        seq = _Seq(spec, rand(case.num_heads), rand(case.num_kv_heads), rand(case.num_kv_heads))
        if spec.prefix_from is not None:
            src = seqs[spec.prefix_from]
            n_prefix = spec.num_prefix_blocks * bs
            seq.k[:n_prefix] = src.k[:n_prefix]
            seq.v[:n_prefix] = src.v[:n_prefix]
            seq.block_ids = src.block_ids[: spec.num_prefix_blocks]
            seq.num_computed = n_prefix
        seq.block_ids = seq.block_ids + [free.pop() for _ in range(n_own)]
        seqs.append(seq)
    return seqs, num_blocks


def _build_step(
    case: AttentionCase, running: list[tuple[_Seq, int]], device: str
) -> tuple[AttentionBatch, list[tuple[int, int]]]:
    """The AttentionBatch for one step and each running sequence's (first, last+1) row."""
    bs = case.block_size
    slots: list[int] = []
    query_start = [0]
    seq_lens: list[int] = []
    for seq, n in running:
        for pos in range(seq.num_computed, seq.num_computed + n):
            slots.append(seq.block_ids[pos // bs] * bs + pos % bs)
        query_start.append(query_start[-1] + n)
        seq_lens.append(seq.num_computed + n)
    slots += [-1] * case.num_padding_tokens
    max_blocks = max(len(seq.block_ids) for seq, _ in running)
    tables = [seq.block_ids + [0] * (max_blocks - len(seq.block_ids)) for seq, _ in running]
    batch = AttentionBatch(
        query_start_loc=torch.tensor(query_start, dtype=torch.int32, device=device),
        seq_lens=torch.tensor(seq_lens, dtype=torch.int32, device=device),
        block_tables=torch.tensor(tables, dtype=torch.int32, device=device),
        slot_mapping=torch.tensor(slots, dtype=torch.int64, device=device),
        max_query_len=max(n for _, n in running),
        max_seq_len=max(seq_lens),
        num_seqs=len(running),
        num_tokens=len(slots),
        query_start_loc_cpu=query_start,
        seq_lens_cpu=seq_lens,
    )
    rows = list(zip(query_start[:-1], query_start[1:], strict=True))
    return batch, rows


def _pack(
    case: AttentionCase,
    running: list[tuple[_Seq, int]],
    name: str,
    num_heads: int,
    dtype: torch.dtype,
    device: str,
) -> torch.Tensor:
    """The step's rows of q, k or v, request after request, then zero padding rows."""
    parts = [getattr(s, name)[s.num_computed : s.num_computed + n] for s, n in running]
    pad = case.num_padding_tokens
    parts.append(torch.zeros(pad, num_heads, case.head_dim, dtype=dtype, device=device))
    return torch.cat(parts)


def _expected_output(
    case: AttentionCase, seq: _Seq, scale: float, cache_dtype: torch.dtype
) -> torch.Tensor:
    k, v = seq.k, seq.v
    if case.kv_cache_dtype != "auto":
        k = fake_quantize_kv(k, case.k_scale, cache_dtype)
        v = fake_quantize_kv(v, case.v_scale, cache_dtype)
    return dense_causal_attention(seq.q, k, v, scale, case.sliding_window, case.logits_soft_cap)


def run_attention_case(
    backend_cls: type[AttentionBackend],
    case: AttentionCase,
    device: str = "cpu",
    dtype: torch.dtype = torch.float32,
    seed: int = 0,
    tolerance: float | None = None,
    stored_kv: bool = False,
) -> None:
    """Run ``case`` through ``backend_cls``; raise ``AssertionError`` on the first mismatch.
    ``stored_kv``: each step's K/V are written where the backend's ``kv_store_target``
    says (``store_kv_reference``, as a fused kernel would) and ``forward_stored`` runs."""
    gen = torch.Generator().manual_seed(seed)
    tol = tolerance if tolerance is not None else _TOLERANCES[dtype]
    scale = case.scale if case.scale is not None else case.head_dim**-0.5
    config = AttentionLayerConfig(
        num_heads=case.num_heads,
        num_kv_heads=case.num_kv_heads,
        head_dim=case.head_dim,
        scale=scale,
        block_size=case.block_size,
        dtype=dtype,
        kv_cache_dtype=case.kv_cache_dtype,
        sliding_window=case.sliding_window,
        logits_soft_cap=case.logits_soft_cap,
    )
    backend = backend_cls(config)
    cache_dtype = _cache_dtype(case, dtype)
    if case.kv_cache_dtype != "auto":
        backend.set_kv_scales(case.k_scale, case.v_scale)
    seqs, num_blocks = _make_sequences(case, dtype, device, gen)
    shape = backend_cls.kv_cache_shape(
        num_blocks, case.block_size, case.num_kv_heads, case.head_dim
    )
    # NaN in never-written slots: a backend that reads a slot it does not own fails loudly.
    kv_cache = torch.full(shape, float("nan"), dtype=cache_dtype, device=device)
    expected = [_expected_output(case, s, scale, cache_dtype) for s in seqs]
    for step in range(case.num_steps):
        running = [(s, s.spec.steps[step]) for s in seqs if step < len(s.spec.steps)]
        running = [(s, n) for s, n in running if n > 0]
        if not running:
            continue
        batch, rows = _build_step(case, running, device)

        q = _pack(case, running, "q", case.num_heads, dtype, device)
        k = _pack(case, running, "k", case.num_kv_heads, dtype, device)
        v = _pack(case, running, "v", case.num_kv_heads, dtype, device)
        metadata = backend.build_metadata(batch)
        if stored_kv:
            target = backend.kv_store_target(kv_cache, metadata)
            assert target is not None, f"{backend_cls.__name__} offers no kv_store_target"
            store_kv_reference(target, k, v)
            out = backend.forward_stored(q, kv_cache, metadata)
        else:
            out = backend.forward(q, k, v, kv_cache, metadata)
        want_shape = (batch.num_tokens, case.num_heads * case.head_dim)
        assert tuple(out.shape) == want_shape, (
            f"{case.name} step {step}: output shape {tuple(out.shape)}, expected {want_shape}"
        )
        for (seq, n), (first, last) in zip(running, rows, strict=True):
            got = out[first:last].double().view(n, case.num_heads, case.head_dim)
            ref = expected[seqs.index(seq)][seq.num_computed : seq.num_computed + n]
            err = (got - ref).abs().max().item()
            assert err <= tol, (
                f"{case.name} step {step}, sequence {seqs.index(seq)} (positions "
                f"{seq.num_computed}..{seq.num_computed + n - 1}): max abs error {err:.3g} "
                f"> {tol:g}"
            )
            seq.num_computed += n


def run_feature_case(
    backend_cls: type[AttentionBackend],
    case: AttentionCase,
    device: str = "cpu",
    dtype: torch.dtype = torch.float32,
    seed: int = 0,
) -> str | None:
    """Run a ``MODEL_FEATURE_ATTENTION_CASES`` case: ``None`` when it matched, the refusal
    message when the backend refused it at construction by a ``ValueError`` naming
    ``case.feature``; a refusal that does not name it, or a mismatch, raises."""
    try:
        run_attention_case(backend_cls, case, device, dtype, seed)
    except ValueError as exc:
        if case.feature and case.feature in str(exc):
            return str(exc)
        raise
    return None


def check_attention_backend(
    backend_cls: type[AttentionBackend],
    device: str = "cpu",
    dtype: torch.dtype = torch.float32,
    cases: tuple[AttentionCase, ...] = ATTENTION_CASES,
) -> list[str]:
    """Run every case; return one line per failing case (empty when the backend conforms)."""
    problems = []
    for case in cases:
        try:
            run_attention_case(backend_cls, case, device, dtype)
        except Exception as exc:  # noqa: BLE001 - report every case, not just the first
            problems.append(f"{case.name}: {type(exc).__name__}: {exc}")
    return problems
