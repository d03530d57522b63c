"""CUDA graphs for decode steps: capture the model once per padded batch size, then replay.

A decode step (one new token per sequence, no prompt logprobs) of ``n`` sequences runs
the graph of the smallest captured size ``b >= n``. Its inputs are copied into static
buffers; rows ``n .. b`` are padding that writes nothing (slot -1) and attends to nothing
(sequence length 0)::

    static rows:   [ r0  r1  ...  r(n-1) | pad ... pad ]     b rows
    slot_mapping:  [ s0  s1  ...         | -1  ...  -1 ]
    seq_lens:      [ l0  l1  ...         |  0  ...   0 ]

The graph covers embedding to final norm. For batches of at most
``LOGITS_IN_GRAPH_MAX_BATCH`` (one GPU, no tensor parallelism) it also computes the logits
and each row's token (``engine_sdk.layers.sampling.RowSampler``: the argmax for greedy
rows, a sample at the row's temperature for the others, read from a static buffer), so a
decode step of plain rows (greedy, or temperature alone) is one graph launch and the
sampler runs no kernel of its own (``Sampler.plain_rows``); larger batches compute logits
eagerly on the ``n`` real rows, so their graphs hold only small activations (a [512,
vocab] float32 logits buffer per size would cost gigabytes). Only backends that declare
``supports_cuda_graphs`` (no host work inside ``forward``) are captured.

With LoRA on, each size is captured twice: without the adapter kernels (a step of base
requests only) and with them, reading each row's slot from the layers' static slot buffer
(padding rows: slot -1).

``ENGINE_TORCH_COMPILE=1`` (a measurement switch, off by default; issue 14 asks whether
inductor helps): the captured decode forward is ``torch.compile``'s (one compile per
captured size, so pair it with a small ``--max-num-seqs``); eager steps stay eager.
"""

from __future__ import annotations

import logging
import os
import time
from typing import TYPE_CHECKING, NamedTuple

import torch
from engine_sdk.interfaces.attention import AttentionBatch
from engine_sdk.layers.sampling import RowSampler

from engine.model_executor.sampler import row_sampler_temperatures

if TYPE_CHECKING:
    from engine.model_executor.inputs import StepInputs
    from engine.model_executor.runner import ModelRunner

logger = logging.getLogger(__name__)

__all__ = ["LOGITS_IN_GRAPH_MAX_BATCH", "CudaGraphRunner", "GraphStep", "capture_sizes"]

LOGITS_IN_GRAPH_MAX_BATCH = 16  # largest captured size whose graph includes the logits


def capture_sizes(max_num_seqs: int) -> list[int]:
    """Batch sizes to capture: fine steps for small batches, coarser for large ones."""
    sizes = [1, 2, 4, 8, 16, 24, 32, 40, 48, 56, 64, 80, 96, 112, 128]
    sizes += list(range(160, 1025, 32))
    top = max(1, max_num_seqs)
    out = [s for s in sizes if s < top]
    return out + [top]


class CudaGraphRunner:
    def __init__(self, runner: ModelRunner, max_num_seqs: int) -> None:
        self.runner = runner
        self.device = runner.device
        self.sizes = capture_sizes(max_num_seqs)
        max_bs = self.sizes[-1]
        max_blocks = -(-runner.max_model_len // runner.block_size)
        dev = self.device
        self.input_ids = torch.zeros(max_bs, dtype=torch.int64, device=dev)
        self.positions = torch.zeros(max_bs, dtype=torch.int64, device=dev)
        self.slot_mapping = torch.full((max_bs,), -1, dtype=torch.int64, device=dev)
        self.seq_lens = torch.zeros(max_bs, dtype=torch.int32, device=dev)
        self.query_start_loc = torch.arange(max_bs + 1, dtype=torch.int32, device=dev)
        self.block_tables = torch.zeros(max_bs, max_blocks, dtype=torch.int32, device=dev)
        self.graphs: dict[tuple[int, bool], torch.cuda.CUDAGraph] = {}
        # Per graph: the final hidden states, or (logits, greedy ids) for small batches.
        self.outputs: dict[tuple[int, bool], torch.Tensor | tuple[torch.Tensor, torch.Tensor]] = {}
        self.logits_max_batch = (
            LOGITS_IN_GRAPH_MAX_BATCH if runner.args.tensor_parallel_size == 1 else 0
        )
        # Each logits row's temperature (0: greedy; padding rows stay 0) for the sampling
        # launch inside the small graphs, rewritten only when the rows' values change.
        self.temperatures = torch.zeros(max(self.logits_max_batch, 1), device=dev)
        self._temperatures_set: list[float] = []
        self.row_sampler: RowSampler | None = None  # made at the first warm-up with logits
        self.lora_context = runner.lora.context if runner.lora is not None else None
        self.pool: object | None = None
        self.model_forward = runner.model
        if os.environ.get("ENGINE_TORCH_COMPILE") == "1":
            logger.info("ENGINE_TORCH_COMPILE=1: the decode graphs capture torch.compile's forward")
            self.model_forward = torch.compile(runner.model, dynamic=False)

    def _batch(self, bs: int) -> AttentionBatch:
        return AttentionBatch(
            query_start_loc=self.query_start_loc[: bs + 1],
            seq_lens=self.seq_lens[:bs],
            block_tables=self.block_tables[:bs],
            slot_mapping=self.slot_mapping[:bs],
            max_query_len=1,
            max_seq_len=self.runner.max_model_len,
            num_seqs=bs,
            num_tokens=bs,
            query_start_loc_cpu=list(range(bs + 1)),
            seq_lens_cpu=[0] * bs,
        )

    def _forward(self, bs: int) -> torch.Tensor | tuple[torch.Tensor, torch.Tensor]:
        runner = self.runner
        metadata = runner.attention_backends[0].build_metadata(self._batch(bs))
        hidden: torch.Tensor = self.model_forward(
            self.input_ids[:bs], self.positions[:bs], runner.kv_caches, metadata
        )
        if bs > self.logits_max_batch:
            return hidden
        logits: torch.Tensor = runner.model.compute_logits(hidden)
        if self.row_sampler is None:  # a warm-up (outside capture): its buffers stay put
            self.row_sampler = RowSampler(self.logits_max_batch, logits.shape[1], self.device)
        return logits, self.row_sampler(logits, self.temperatures[:bs])

    @torch.inference_mode()
    def capture(self) -> None:
        start = time.perf_counter()
        free_before = torch.cuda.mem_get_info(self.device)[0]
        stream = torch.cuda.Stream(self.device)
        stream.wait_stream(torch.cuda.current_stream(self.device))
        with torch.cuda.stream(stream):
            for bs in reversed(self.sizes):  # largest first: later graphs reuse its pool
                for lora in (False, True) if self.lora_context is not None else (False,):
                    self._capture_one(bs, lora, stream)
            if self.lora_context is not None:
                self.lora_context.active = False
        torch.cuda.current_stream(self.device).wait_stream(stream)
        torch.cuda.synchronize(self.device)
        used = free_before - torch.cuda.mem_get_info(self.device)[0]
        logger.info(
            "captured CUDA graphs for %d decode batch sizes (1..%d) in %.1f s, %.0f MiB",
            len(self.sizes),
            self.sizes[-1],
            time.perf_counter() - start,
            used / 2**20,
        )

    def _capture_one(self, bs: int, lora: bool, stream: torch.cuda.Stream) -> None:
        if self.lora_context is not None:
            self.lora_context.active = lora
            self.lora_context.token_slots.fill_(-1)
        self._forward(bs)  # warm up (Triton compiles, cuBLAS picks kernels)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph, pool=self.pool, stream=stream):
            out = self._forward(bs)
        if self.pool is None:
            self.pool = graph.pool()
        self.graphs[bs, lora] = graph
        self.outputs[bs, lora] = out

    def can_run(self, inputs: StepInputs) -> bool:
        batch = inputs.attn_batch
        return (
            batch.max_query_len == 1
            and 0 < batch.num_seqs <= self.sizes[-1]
            and batch.num_tokens == batch.num_seqs
            and inputs.num_prompt_rows == 0
            and len(inputs.sample_requests) == batch.num_seqs
            and batch.block_tables.shape[1] <= self.block_tables.shape[1]
        )

    def run(self, inputs: StepInputs) -> GraphStep:
        """Replay the graph for this decode step: float32 logits [num_seqs, vocab], and
        their argmax where the graph computed it."""
        batch = inputs.attn_batch
        n = batch.num_seqs
        bs = next(s for s in self.sizes if s >= n)
        cols = batch.block_tables.shape[1]
        self.input_ids[:n].copy_(inputs.input_ids, non_blocking=True)
        self.positions[:n].copy_(inputs.positions, non_blocking=True)
        self.slot_mapping[:n].copy_(batch.slot_mapping, non_blocking=True)
        self.seq_lens[:n].copy_(batch.seq_lens, non_blocking=True)
        self.block_tables[:n, :cols].copy_(batch.block_tables, non_blocking=True)
        if bs > n:
            self.slot_mapping[n:bs].fill_(-1)
            self.seq_lens[n:bs].zero_()
        if bs <= self.logits_max_batch:
            self._set_temperatures(inputs, bs)
        lora = inputs.lora_active
        if lora and bs > n:
            assert self.lora_context is not None
            self.lora_context.token_slots[n:bs].fill_(-1)  # (rows < n: set by the runner)
        self.graphs[bs, lora].replay()
        # Decode rows are in request order and every request samples: row i is request i.
        out = self.outputs[bs, lora]
        if isinstance(out, tuple):
            return GraphStep(out[0][:n], out[1][:n])
        return GraphStep(self.runner.model.compute_logits(out[:n]), None)

    def _set_temperatures(self, inputs: StepInputs, bs: int) -> None:
        values = row_sampler_temperatures(
            [sr.request.sampling_params for sr in inputs.sample_requests]
        )
        values += [0.0] * (bs - len(values))
        if values != self._temperatures_set[:bs]:
            self.temperatures[:bs].copy_(torch.tensor(values), non_blocking=True)
            self._temperatures_set[:bs] = values


class GraphStep(NamedTuple):
    logits: torch.Tensor  # float32 [num_seqs, vocab]
    # long [num_seqs], when the graph has them: greedy rows' argmax (ties: lowest id),
    # other rows a sample at their temperature alone (valid for Sampler.plain_rows batches)
    token_ids: torch.Tensor | None
