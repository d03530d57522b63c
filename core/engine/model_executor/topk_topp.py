"""Truncation of a batch of (temperature-scaled) logits: top-k, top-p, min-p.

Same definitions as Hugging Face's ``TopKLogitsWarper``, ``TopPLogitsWarper`` and
``MinPLogitsWarper`` (and vLLM's sampler), applied in that order:

- top-k: keep the tokens whose logit is >= the k-th largest (ties at the k-th value stay).
- top-p: sort ascending, drop the tokens whose cumulative probability is <= ``1 - top_p``;
  the most likely token always stays.
- min-p: drop the tokens whose probability is < ``min_p * max probability``.

Dropped tokens become ``-inf``. Each takes per-row tensors and a row whose value means
"off" (``top_k == vocab_size``, ``top_p == 1``, ``min_p == 0``) comes out unchanged.
Top-k alone uses ``torch.topk`` with the largest k in the batch, not a full sort; only
top-p needs the sort.
"""

from __future__ import annotations

import torch


def apply_top_k_top_p(
    logits: torch.Tensor,
    top_k: torch.Tensor | None,
    top_p: torch.Tensor | None,
    max_top_k: int | None = None,
) -> torch.Tensor:
    """Mask ``logits`` ``[n, V]`` to each row's top-k / top-p set; returns a new tensor.

    ``top_k``: long ``[n]`` in ``[1, V]`` (``V`` = off); ``top_p``: float ``[n]`` in
    ``(0, 1]``. Either may be ``None`` (off for every row). ``max_top_k``: the largest k
    of the rows that use top-k, known on the host (no device sync to find it); ``None``
    means ``V``.
    """
    if top_p is None:
        if top_k is None:
            return logits
        return _apply_top_k_only(logits, top_k, max_top_k)

    vocab_size = logits.shape[1]
    # Ascending sort: index V - k holds the k-th largest value.
    #   sorted:  [ smallest ... | k-th largest ... largest ]
    #   index:     0              V - k           V - 1
    logits_sort, logits_idx = logits.sort(dim=-1, descending=False)
    if top_k is not None:
        kth_index = (vocab_size - top_k).clamp(0, vocab_size - 1)[:, None]
        kth_value = logits_sort.gather(1, kth_index)
        logits_sort.masked_fill_(logits_sort < kth_value, float("-inf"))
    probs_sum = logits_sort.softmax(dim=-1).cumsum(dim=-1)
    top_p_mask = probs_sum <= (1 - top_p)[:, None]
    top_p_mask[:, -1] = False
    logits_sort.masked_fill_(top_p_mask, float("-inf"))
    return torch.empty_like(logits).scatter_(1, logits_idx, logits_sort)


def _apply_top_k_only(
    logits: torch.Tensor, top_k: torch.Tensor, max_top_k: int | None
) -> torch.Tensor:
    vocab_size = logits.shape[1]
    max_k = vocab_size if max_top_k is None else max(1, min(max_top_k, vocab_size))
    top_values = logits.topk(max_k, dim=-1).values  # descending: column j = (j+1)-th largest
    kth_value = top_values.gather(1, (top_k.clamp(1, max_k) - 1)[:, None])
    # Rows beyond max_k are the rows with top-k off (k == V): keep everything.
    kth_value.masked_fill_(top_k[:, None] > max_k, float("-inf"))
    return logits.masked_fill(logits < kth_value, float("-inf"))


def apply_min_p(logits: torch.Tensor, min_p: torch.Tensor) -> torch.Tensor:
    """Mask tokens with probability < ``min_p * max probability``; returns a new tensor.

    ``min_p``: float ``[n]`` in ``[0, 1]``. The most likely token always stays because
    ``min_p <= 1``.
    """
    probs = logits.softmax(dim=-1)
    threshold = min_p[:, None] * probs.amax(dim=-1, keepdim=True)
    return logits.masked_fill(probs < threshold, float("-inf"))
