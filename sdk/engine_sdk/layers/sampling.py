"""One launch that turns a few rows of logits into token ids: greedy rows (temperature 0)
get the argmax, the others a sample of ``softmax(logits / temperature)`` drawn by the
Gumbel-max trick (``argmax(logits / T + G)``, ``G = -log(-log(U))``), which has the
distribution of the exponential race the engine's sampler runs (``argmax(p / E)``,
``E ~ Exp(1)``: ``-log E`` is Gumbel).

It is for plain rows only (no top-k/top-p/min-p, penalties, seeds or logprobs), where it
replaces about six launches with one (with a packed allowed-token mask per row, the
structured-output path, about ten), and it is static (fixed buffers, no host
work), so the decode CUDA graph can contain it. The noise is keyed by a step counter on
the device that the launch itself advances (Philox: a fresh draw every launch, rows
independent); it is not reproducible from a request's seed, so seeded rows take the
sampler's own path.

The grid is rows x vocabulary chunks (a row of 151,936 logits would take one program
several microseconds); the last chunk of each row to finish reduces the chunks' winners
(an acq_rel counter per row, back at zero afterwards, as in ``split_k``).
"""

from __future__ import annotations

import torch

__all__ = ["RowSampler", "sample_rows_reference"]

BLOCK = 4096  # logits per program


class RowSampler:
    """The kernel's persistent state for up to ``max_rows`` rows of ``vocab_size`` logits
    on ``device``: the step counter, the per-row counters and the chunk winners."""

    def __init__(self, max_rows: int, vocab_size: int, device: torch.device) -> None:
        self.max_rows = max_rows
        self.vocab_size = vocab_size
        self.num_chunks = -(-vocab_size // BLOCK)
        self.chunks_p = 1 << (self.num_chunks - 1).bit_length()
        seed = int(torch.randint(0, 2**31 - 1, (1,)).item())  # different noise per engine
        self.step = torch.full((1,), seed, dtype=torch.int64, device=device)
        self.locks = torch.zeros(max_rows + 1, dtype=torch.int32, device=device)
        self.part_val = torch.empty(max_rows, self.chunks_p, dtype=torch.float32, device=device)
        self.part_idx = torch.empty(max_rows, self.chunks_p, dtype=torch.int32, device=device)

    def __call__(
        self,
        logits: torch.Tensor,
        temperatures: torch.Tensor,
        allowed_bits: torch.Tensor | None = None,
    ) -> torch.Tensor:
        """long ``[rows]``: each row's id (``temperatures`` float32 ``[rows]``, 0: greedy).
        ``allowed_bits`` (uint8 ``[rows, bytes]``, bit ``id % 8`` of byte ``id // 8``):
        only the ids whose bit is set can be drawn (structured outputs' packed masks),
        read in the same pass over the logits."""
        from engine_sdk.layers._sampling_kernels import sample_rows_kernel
        from engine_sdk.layers.pdl import pdl_launch

        num_rows, vocab_size = logits.shape
        assert num_rows <= self.max_rows and vocab_size == self.vocab_size
        assert logits.stride(1) == 1 and temperatures.shape == (num_rows,)
        masked = allowed_bits is not None
        if allowed_bits is not None:
            assert allowed_bits.dtype == torch.uint8 and allowed_bits.stride(1) == 1
            assert allowed_bits.shape[0] == num_rows and allowed_bits.shape[1] * 8 >= vocab_size
        bits = allowed_bits if allowed_bits is not None else self.locks
        out = torch.empty(num_rows, dtype=torch.int64, device=logits.device)
        if num_rows == 0:
            return out
        sample_rows_kernel[(num_rows, self.num_chunks)](
            logits, temperatures, self.step, self.part_val, self.part_idx, self.locks, out,
            vocab_size, logits.stride(0), num_rows, self.num_chunks,
            bits, bits.stride(0) if masked else 0,
            BLOCK=BLOCK, CHUNKS_P=self.chunks_p, MASKED=masked, num_warps=4,
            **pdl_launch(logits),
        )  # fmt: skip
        return out


def sample_rows_reference(
    logits: torch.Tensor,
    temperatures: torch.Tensor,
    generator: torch.Generator | None = None,
    allowed_bits: torch.Tensor | None = None,
) -> torch.Tensor:
    """What ``RowSampler`` computes, in torch (its noise comes from ``generator``)."""
    x = logits.float()
    if allowed_bits is not None:
        ids = torch.arange(x.shape[1], device=x.device)
        bytes_ = allowed_bits.to(x.device).long()[:, ids >> 3]
        x = x.masked_fill(((bytes_ >> (ids & 7)) & 1) == 0, float("-inf"))
    temps = temperatures.float().to(x.device)
    u = torch.rand(x.shape, generator=generator, device=x.device)
    noisy = x / temps.clamp_min(1e-30)[:, None] - torch.log(-torch.log(u))
    return torch.where(temps[:, None] > 0, noisy, x).argmax(dim=-1)
