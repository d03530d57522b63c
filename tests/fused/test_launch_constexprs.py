"""The decode step's Triton launches name every constexpr, defaults included: torch.compile
(inductor) builds a user kernel's launcher from the call site's arguments, and a constexpr
left to its default made the first launch fail on an H100 (``launcher() missing 1
required positional argument: '_grid_2'``, round 19). Triton's interpreter on CPU."""

from __future__ import annotations

import torch
from engine_sdk.layers.sampling import BLOCK, RowSampler
from engine_sdk.testing.launches import constexpr_defaults, recorded_launches


def test_the_recorder_sees_a_defaulted_constexpr_left_out():
    """The check itself: a launch leaving ``PDL`` out is reported, one naming it is not."""
    from engine_sdk.layers._fused_kernels import rms_norm_kernel

    assert constexpr_defaults(rms_norm_kernel) == {"PDL": False}
    x = torch.randn(2, 16)
    w = torch.ones(16)
    out = torch.empty_like(x)
    args = (x, w, out, x.stride(0), out.stride(0), 16, 1e-6)
    with recorded_launches() as seen:
        rms_norm_kernel[(2,)](*args, BLOCK=16)
    assert seen.kernels == {"rms_norm_kernel"}
    assert seen.unpassed == {("rms_norm_kernel", "PDL")}
    with recorded_launches() as seen:
        rms_norm_kernel[(2,)](*args, BLOCK=16, PDL=False)
    assert seen.unpassed == set()


def test_decoder_forward_names_every_constexpr(monkeypatch, tmp_path):
    """A decode row through a tiny Qwen3 with the fused kernels forced on (the GPU's
    decode path): norms, q/k norm + rope, the GEMVs with and without the norm."""
    from tiny_decoder import tiny_bf16_qwen3

    monkeypatch.setenv("ENGINE_GEMV", "force")
    monkeypatch.setenv("ENGINE_FUSED_OPS", "force")
    _model, logits = tiny_bf16_qwen3(tmp_path, "cpu")
    with recorded_launches() as seen:
        logits()
    assert {"gemv_kernel", "gemv_add_rms_norm_kernel", "rms_norm_kernel",
            "qkv_norm_rope_kernel", "add_rms_norm_kernel"} <= seen.kernels  # fmt: skip
    assert seen.unpassed == set()


def test_row_sampler_names_every_constexpr():
    vocab = BLOCK + 17
    sampler = RowSampler(4, vocab, torch.device("cpu"))
    logits = torch.randn(2, vocab)
    with recorded_launches() as seen:
        sampler(logits, torch.tensor([0.0, 1.0]))
    assert seen.kernels
    assert seen.unpassed == set()
