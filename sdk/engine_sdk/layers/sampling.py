"""One launch that turns a few rows of logits into token ids: greedy rows (temperature 0)
get the argmax, the others a sample of ``softmax(logits / temperature)`` drawn by the
Gumbel-max trick (``argmax(logits / T + G)``, ``G = -log(-log(U))``), which has the
distribution of the exponential race the engine's sampler runs (``argmax(p / E)``,
``E ~ Exp(1)``: ``-log E`` is Gumbel).

It is for plain rows only (no top-k/top-p/min-p, penalties, masks, seeds or logprobs),
where it replaces about six launches with one, and it is static (fixed buffers, no host
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

    def __call__(self, logits: torch.Tensor, temperatures: torch.Tensor) -> torch.Tensor:
        """long ``[rows]``: each row's id (``temperatures`` float32 ``[rows]``, 0: greedy)."""
        from engine_sdk.layers._sampling_kernels import sample_rows_kernel

        num_rows, vocab_size = logits.shape
        assert num_rows <= self.max_rows and vocab_size == self.vocab_size
        assert logits.stride(1) == 1 and temperatures.shape == (num_rows,)
        out = torch.empty(num_rows, dtype=torch.int64, device=logits.device)
        if num_rows == 0:
            return out
        sample_rows_kernel[(num_rows, self.num_chunks)](
            logits, temperatures, self.step, self.part_val, self.part_idx, self.locks, out,
            vocab_size, logits.stride(0), num_rows, self.num_chunks,
            BLOCK=BLOCK, CHUNKS_P=self.chunks_p, num_warps=4,
        )  # fmt: skip
        return out


def sample_rows_reference(
    logits: torch.Tensor, temperatures: torch.Tensor, generator: torch.Generator | None = None
) -> torch.Tensor:
    """What ``RowSampler`` computes, in torch (its noise comes from ``generator``)."""
    x = logits.float()
    temps = temperatures.float().to(x.device)
    u = torch.rand(x.shape, generator=generator, device=x.device)
    noisy = x / temps.clamp_min(1e-30)[:, None] - torch.log(-torch.log(u))
    return torch.where(temps[:, None] > 0, noisy, x).argmax(dim=-1)
