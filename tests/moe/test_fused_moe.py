"""The SDK's fused MoE layer: routing rules, the torch reference against a dense
per-token computation, the Triton grouped GEMM (in the interpreter on CPU) against the
reference, per-expert loading and intermediate-dimension sharding."""

from __future__ import annotations

import pytest
import torch
from engine_sdk.layers.moe import FusedMoE, moe_reference, route
from engine_sdk.layers.parallel import TensorParallelGroup

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"


def _dense(x, w13, w2, weights, ids):
    """Token by token, slot by slot, in float64."""
    inter = w2.shape[-1]
    out = torch.zeros(x.shape, dtype=torch.float64)
    for t in range(x.shape[0]):
        for k in range(ids.shape[1]):
            e = int(ids[t, k])
            gu = w13[e].double() @ x[t].double()
            h = torch.nn.functional.silu(gu[:inter]) * gu[inter:]
            out[t] += float(weights[t, k]) * (w2[e].double() @ h)
    return out


def _problem(num_tokens, num_experts, top_k, hidden, inter, seed=0, dtype=torch.float32):
    gen = torch.Generator().manual_seed(seed)
    x = torch.randn(num_tokens, hidden, generator=gen)
    w13 = torch.randn(num_experts, 2 * inter, hidden, generator=gen) / hidden**0.5
    w2 = torch.randn(num_experts, hidden, inter, generator=gen) / inter**0.5
    logits = torch.randn(num_tokens, num_experts, generator=gen)
    return [t.to(dtype) for t in (x, w13, w2, logits)]


def test_route_softmax_topk_and_renormalisation() -> None:
    logits = torch.tensor([[0.0, 1.0, 2.0, 3.0]])
    weights, ids = route(logits, 2, renormalize=False)
    probs = torch.softmax(logits, -1)
    assert ids.tolist() == [[3, 2]]
    torch.testing.assert_close(weights, probs[:, [3, 2]])
    weights, _ = route(logits, 2, renormalize=True)
    torch.testing.assert_close(weights.sum(-1), torch.ones(1))
    torch.testing.assert_close(weights[0, 0] / weights[0, 1], probs[0, 3] / probs[0, 2])


def test_reference_matches_dense() -> None:
    x, w13, w2, logits = _problem(9, 6, 2, 32, 24)
    weights, ids = route(logits, 2, True)
    got = moe_reference(x, w13, w2, weights, ids)
    torch.testing.assert_close(got.double(), _dense(x, w13, w2, weights, ids), atol=1e-5, rtol=0)


@pytest.mark.parametrize(
    ("num_tokens", "num_experts", "top_k", "hidden", "inter"),
    [(1, 8, 2, 64, 32), (5, 4, 2, 48, 40), (37, 8, 3, 32, 80), (3, 16, 8, 64, 16)],
    ids=["decode", "odd-sizes", "many-tokens", "more-slots-than-tokens"],
)
def test_triton_matches_reference(
    monkeypatch: pytest.MonkeyPatch, num_tokens, num_experts, top_k, hidden, inter
) -> None:
    from engine_sdk.layers._moe_kernels import fused_moe

    x, w13, w2, logits = (
        t.to(DEVICE) for t in _problem(num_tokens, num_experts, top_k, hidden, inter)
    )
    weights, ids = route(logits, top_k, False)
    want = moe_reference(x, w13, w2, weights, ids)
    got = fused_moe(x, w13, w2, weights, ids)
    torch.testing.assert_close(got, want, atol=2e-5, rtol=1e-4)


def test_align_by_expert_groups_and_pads() -> None:
    from engine_sdk.layers._moe_kernels import align_by_expert

    ids = torch.tensor([[2, 0], [2, 5], [0, 2]])  # slots 0..5
    slots, block_expert = align_by_expert(ids, 6, block_m=4)
    groups = [slots[b * 4 : (b + 1) * 4].tolist() for b in range(block_expert.numel())]
    used = {int(e): g for e, g in zip(block_expert.tolist(), groups, strict=True) if e >= 0}
    assert used == {0: [1, 4, 6, 6], 2: [0, 2, 5, 6], 5: [3, 6, 6, 6]}
    assert all(e == -1 for e in block_expert.tolist()[3:])


def test_forward_uses_triton_when_forced(monkeypatch: pytest.MonkeyPatch) -> None:
    x, w13, w2, logits = _problem(6, 4, 2, 32, 16)
    layer = FusedMoE(4, 2, 32, 16, renormalize=True)
    layer.w13.data.copy_(w13)
    layer.w2.data.copy_(w2)
    monkeypatch.setenv("ENGINE_FUSED_OPS", "0")
    reference = layer(x, logits)
    monkeypatch.setenv("ENGINE_FUSED_OPS", "force")
    torch.testing.assert_close(layer(x, logits), reference, atol=2e-5, rtol=1e-4)


class _SumGroup(TensorParallelGroup):
    """A stand-in for the collective: records outputs; the test sums them."""

    def all_reduce(self, x: torch.Tensor) -> torch.Tensor:
        return x


def test_tensor_parallel_shards_sum_to_the_whole() -> None:
    x, w13, w2, logits = _problem(7, 4, 2, 32, 24)
    inter = 24

    def load(layer: FusedMoE) -> None:
        for e in range(4):
            layer.load_expert(e, "gate", w13[e, :inter])
            layer.load_expert(e, "up", w13[e, inter:])
            layer.load_expert(e, "down", w2[e])

    whole = FusedMoE(4, 2, 32, inter, renormalize=False)
    load(whole)
    parts = []
    for rank in range(3):
        shard = FusedMoE(4, 2, 32, inter, False, tp=_SumGroup(rank=rank, size=3))
        load(shard)
        assert shard.w13.shape == (4, 16, 32) and shard.w2.shape == (4, 32, 8)
        parts.append(shard(x, logits))
    torch.testing.assert_close(sum(parts), whole(x, logits), atol=1e-5, rtol=1e-5)


def test_load_expert_rejects_wrong_shapes() -> None:
    layer = FusedMoE(4, 2, 32, 24, renormalize=False, prefix="model.layers.0.mlp.experts")
    with pytest.raises(ValueError, match=r"expert 1 down_proj has shape \(24, 32\).*\(32, 24\)"):
        layer.load_expert(1, "down", torch.zeros(24, 32))
    with pytest.raises(ValueError, match="checkpoint has expert 9"):
        layer.load_expert(9, "gate", torch.zeros(24, 32))


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
@pytest.mark.parametrize("num_tokens", [1, 33, 1024])
def test_triton_matches_reference_at_qwen3_30b_a3b_shape_bf16(num_tokens: int) -> None:
    """hidden 2048, 128 experts of 768, top 8: the shape benchmarks/moe_gpu.py times."""
    from engine_sdk.layers._moe_kernels import fused_moe

    x, w13, w2, logits = (
        t.to("cuda", torch.bfloat16) for t in _problem(num_tokens, 128, 8, 2048, 768)
    )
    weights, ids = route(logits, 8, True)
    want = moe_reference(x, w13, w2, weights, ids).float()
    got = fused_moe(x, w13, w2, weights, ids).float()
    assert (got - want).abs().max() <= 2e-2 * want.abs().max()
