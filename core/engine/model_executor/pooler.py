"""One engine step of a pooling model: hidden states in, one vector per finished prompt.

A pooling request is prefill-only: the scheduler runs its prompt in chunks like any other
(same budget, same block tables), and the step that completes the prompt (``sample``) is
its last. Rows are packed request after request, so request i owns the rows
``[offset_i, offset_i + num_tokens_i)`` of the step's hidden states::

    step rows   | req a: chunk 2 (3 rows) | req b: whole prompt (2 rows) |
    last        |             ^ a's last  |                  ^ b's last  |
    mean        | sum += rows, n += 3     | sum += rows, n += 2          |

Mean pooling sums float32 rows over the chunks, with the position the sum has reached. A
preempted request is recomputed from its first uncached position, which is never past
that point (its own blocks are the only cache hits it can have: it has a cache salt of its
own), so rows already in the sum are skipped rather than counted twice::

    summed [0, 12)   recompute chunk at 8, 8 rows   -> add rows 12..15 (skip 4 rows)

The finishing step reports the pooled vector (not normalized:
the API layer normalizes after any Matryoshka truncation) and a placeholder token id 0,
which ends the request (``max_tokens`` 1) and frees its KV blocks.
"""

from __future__ import annotations

from typing import Any

import torch

from engine.core.request import ReqId
from engine.core.scheduler_output import ModelRunnerOutput, SchedulerOutput
from engine.model_executor.pooling_task import PoolingConfig

PLACEHOLDER_TOKEN_ID = 0


class Pooler:
    def __init__(self, config: PoolingConfig) -> None:
        self.config = config
        # req_id -> (sum of the rows of positions [0, end), end)
        self._sums: dict[ReqId, tuple[torch.Tensor, int]] = {}

    def drop(self, req_ids: set[ReqId]) -> None:
        for req_id in req_ids:
            self._sums.pop(req_id, None)

    def execute(self, runner: Any, so: SchedulerOutput) -> ModelRunnerOutput:
        output = ModelRunnerOutput()
        if so.is_empty:
            return output
        inputs = runner.prepare_inputs(so)
        metadata = runner.attention_backends[0].build_metadata(inputs.attn_batch)
        hidden = runner.model(inputs.input_ids, inputs.positions, runner.kv_caches, metadata)
        offset = 0
        for sr in so.scheduled:
            rows = hidden[offset : offset + sr.num_tokens]
            offset += sr.num_tokens
            pooled = self._pool(sr.req_id, rows, sr.start_position)
            if sr.sample:
                output.pooled[sr.req_id] = pooled.tolist()
                output.sampled_token_ids[sr.req_id] = PLACEHOLDER_TOKEN_ID
        return output

    def _pool(self, req_id: ReqId, rows: torch.Tensor, start: int) -> torch.Tensor:
        """Fold this step's rows (positions ``start``...) in; the pooled vector so far."""
        if self.config.pooling == "last":
            return rows[-1].float()
        previous, end = self._sums.get(req_id, (None, 0))
        if start > end:
            raise RuntimeError(
                f"mean pooling of request {req_id!r}: positions {end}..{start - 1} were never "
                "computed (a prefix-cache hit on a request without its own cache salt)"
            )
        new_rows = rows[end - start :]
        total = new_rows.float().sum(dim=0)
        if previous is not None:
            total = total + previous
        end = max(end, start + rows.shape[0])
        self._sums[req_id] = (total, end)
        return total / end


def make_pooler(args: Any, pm: Any, source: Any) -> Pooler | None:
    """A ``Pooler`` when the checkpoint runs as an embedding model, else ``None``."""
    from engine.model_executor.pooling_task import resolve_pooling

    config = resolve_pooling(args, pm, source.hf_config, source.path)
    return None if config is None else Pooler(config)
