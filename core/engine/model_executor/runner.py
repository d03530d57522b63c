"""The model runner: owns the model, the KV cache and the sampler; runs one step at a time.

Startup phases: device and dtype, free-memory check (GPU), attention backend, model and
weights, memory plan, KV cache allocation. ``execute(SchedulerOutput)`` packs the step's
tokens, runs the model, computes logits only for the rows that need them and samples.

Per-request state kept here: a ``torch.Generator`` for seeded requests (kept across
preemption so a seeded request's tokens do not depend on scheduling) and how far prompt
logprobs were reported; both are dropped when the request appears in ``finished_req_ids``.
Structured outputs: a grammar matcher per constrained request (``StructuredOutputState``)
gives the sampler an allowed-token mask per row and is advanced by the sampled tokens; the
engine shares its ``StructuredOutputManager`` (``structured_outputs.set_manager``), a worker
process builds its own on first use.
"""

from __future__ import annotations

import logging
from typing import Any

import torch
from engine_sdk.interfaces.attention import AttentionBackend, AttentionLayerConfig

from engine.config import EngineArgs
from engine.core.request import ReqId
from engine.core.scheduler_output import ModelRunnerOutput, ScheduledRequest, SchedulerOutput
from engine.errors import StartupError
from engine.lora.slots import LoRASlotManager
from engine.model_executor.cuda_graphs import CudaGraphRunner
from engine.model_executor.host_copy import HostCopy
from engine.model_executor.inputs import StepInputs, StepInputsBuilder
from engine.model_executor.kv_cache_dtype import resolve_kv_cache_dtype
from engine.model_executor.loader import LoadConfig, load_model, resolve_device, resolve_dtype
from engine.model_executor.logprobs import gather_prompt_logprobs, unpack_prompt_logprobs
from engine.model_executor.memory import (
    MemoryPlan,
    check_free_memory,
    plan_cpu_kv_cache,
    plan_gpu_kv_cache,
    resolve_max_model_len,
)
from engine.model_executor.plugin_needs import attention_needs, choose_attention_backend
from engine.model_executor.pooler import make_pooler
from engine.model_executor.profiling import profile_gpu_memory
from engine.model_executor.sampler import DeviceSample, Sampler, SamplingBatch
from engine.model_executor.source import ModelSource
from engine.structured_output.runner_state import ReasoningGate, StructuredOutputState

logger = logging.getLogger(__name__)

__all__ = ["ModelRunner", "PendingStep"]


def tensor_bytes(tensors: list[torch.Tensor]) -> int:
    """Bytes of the distinct storages behind ``tensors`` (merged q/k/v weights and their
    per-projection views count once)."""
    seen: dict[int, int] = {}
    for t in tensors:
        storage = t.untyped_storage()
        seen[storage.data_ptr()] = max(seen.get(storage.data_ptr(), 0), storage.nbytes())
    return sum(seen.values())


class ModelRunner:
    def __init__(
        self, args: EngineArgs, pm: Any, source: ModelSource, sampler: Sampler | None = None
    ) -> None:
        self.args = args
        self.source = source
        self.device = resolve_device(args.device)
        self.dtype = resolve_dtype(args.dtype, source.hf_config, self.device)
        self.kv_cache_dtype = resolve_kv_cache_dtype(args.kv_cache_dtype, self.dtype)
        if args.block_size < 1:
            raise StartupError(f"--block-size must be at least 1, got {args.block_size}")
        self.block_size = args.block_size
        self.max_model_len = resolve_max_model_len(args.max_model_len, source.hf_config)
        free_at_start = self._check_free_memory()
        self.backend_cls = self._select_backend(pm)
        self.attention_configs: list[AttentionLayerConfig] = []
        self.attention_backends: list[AttentionBackend] = []
        load_config = LoadConfig(
            self.device, self.dtype, self.block_size, self._make_attention, args.kv_cache_dtype
        )
        self.model = load_model(args, pm, source, load_config)
        self.pooler = make_pooler(args, pm, source)  # None unless the model embeds
        self.weights_bytes = tensor_bytes([*self.model.parameters(), *self.model.buffers()])
        self.lora = self._setup_lora()  # adapter slots on every LoRA-capable projection
        self.vocab_size = int(source.hf_config.vocab_size)
        self.sampler = sampler if sampler is not None else Sampler()
        self.structured_outputs = StructuredOutputState(
            lambda: self._build_structured_output_manager(pm), lambda tok: self._gate(pm, tok)
        )
        self._log_kv_cache_dtype()
        self.plan = self._plan_memory(free_at_start)
        self.num_blocks = self.plan.num_blocks
        self.kv_caches = self.allocate_kv_caches(self.num_blocks)
        self.cuda_graphs = self._capture_cuda_graphs()
        self._generators: dict[ReqId, torch.Generator] = {}
        self._prompt_logprobs_done: dict[ReqId, int] = {}
        # Keeps block tables between steps and copies only new block ids.
        self._inputs_builder = StepInputsBuilder(self.block_size, self.device)
        # The last launched step's sampled ids (on the device) and each request's row.
        self._prev_sampled: torch.Tensor | None = None
        self._prev_rows: dict[ReqId, int] = {}

    # -- startup phases -------------------------------------------------------------------

    def _check_free_memory(self) -> int | None:
        """Error (c) on GPU; returns the free bytes at startup (None on CPU)."""
        if self.device.type != "cuda":
            return None
        free, total = torch.cuda.mem_get_info(self.device)
        if self.args.kv_cache_memory_bytes is None:
            check_free_memory(total, free, self.args.gpu_memory_utilization)
        return int(free)

    def _setup_lora(self) -> LoRASlotManager | None:
        from engine.lora.adapter import LoRAAdapterError
        from engine.lora.config import LoRAConfig

        try:
            config = LoRAConfig.from_engine_args(self.args)
            if config is None:
                return None
            max_tokens = max(self.args.effective_max_num_batched_tokens(), self.args.max_num_seqs)
            return LoRASlotManager(self.model, config, max_tokens, self.device, self.dtype)
        except (ValueError, LoRAAdapterError) as exc:
            raise StartupError(str(exc)) from None

    def _select_backend(self, pm: Any) -> type[AttentionBackend]:
        needs = attention_needs(
            self.args, self.device, self.dtype, self.block_size, self.source.hf_config
        )
        backend = choose_attention_backend(pm, self.args, needs)
        logger.info("attention backend: %s", backend.name or backend.__name__)
        return backend

    def _make_attention(self, config: AttentionLayerConfig) -> AttentionBackend:
        backend = self.backend_cls(config)
        self.attention_configs.append(config)
        self.attention_backends.append(backend)
        return backend

    def _layer_cache_shape(self, config: AttentionLayerConfig, num_blocks: int) -> tuple[int, ...]:
        return self.backend_cls.kv_cache_shape(
            num_blocks, self.block_size, config.num_kv_heads, config.head_dim
        )

    @property
    def bytes_per_block(self) -> int:
        """KV bytes of one block over all layers (from the backend's cache shape)."""
        element = torch.empty((), dtype=self.kv_cache_dtype).element_size()
        total = 0
        for config in self.attention_configs:
            numel = 1
            for dim in self._layer_cache_shape(config, 1):
                numel *= dim
            total += numel * element
        return total

    def _log_kv_cache_dtype(self) -> None:
        """Say how K/V are stored; for fp8, where the per-layer scales came from."""
        if self.args.kv_cache_dtype == "auto":
            return
        scales = [b.kv_scales.tolist() for b in self.attention_backends]
        num_scaled = sum(1 for k, v in scales if (k, v) != (1.0, 1.0))
        logger.info(
            "KV cache dtype %s (%s, %d byte(s) per element); %d of %d layers have K/V scales "
            "other than 1.0 (from the checkpoint)",
            self.args.kv_cache_dtype,
            str(self.kv_cache_dtype).removeprefix("torch."),
            torch.empty((), dtype=self.kv_cache_dtype).element_size(),
            num_scaled,
            len(scales),
        )
        if num_scaled == 0:
            logger.warning(
                "--kv-cache-dtype %s: the checkpoint has no k_scale/v_scale tensors (or only "
                "1.0), so K/V are stored with scale 1.0 and values beyond +-%g clip",
                self.args.kv_cache_dtype,
                torch.finfo(self.kv_cache_dtype).max,
            )

    def _plan_memory(self, free_at_start: int | None) -> MemoryPlan:
        num_layers = self.model.num_attention_layers()
        if len(self.attention_configs) != num_layers:
            raise StartupError(
                f"{type(self.model).__name__} built {len(self.attention_configs)} attention "
                f"layers but reports num_attention_layers() = {num_layers}; fix the model plugin"
            )
        args = self.args
        if self.device.type == "cuda":
            assert free_at_start is not None
            profile = profile_gpu_memory(
                self, free_at_start, args.effective_max_num_batched_tokens()
            )
            plan = plan_gpu_kv_cache(
                profile,
                args.gpu_memory_utilization,
                self.bytes_per_block,
                self.block_size,
                self.max_model_len,
                args.kv_cache_memory_bytes,
            )
        else:
            plan = plan_cpu_kv_cache(
                args.kv_cache_memory_bytes,
                self.bytes_per_block,
                self.block_size,
                self.max_model_len,
                args.max_num_seqs,
            )
        plan.log(self.weights_bytes)
        return plan

    def allocate_kv_caches(self, num_blocks: int) -> list[torch.Tensor]:
        """One zeroed cache tensor per attention layer, shaped by the backend."""
        return [
            torch.zeros(
                self._layer_cache_shape(config, num_blocks),
                dtype=self.kv_cache_dtype,
                device=self.device,
            )
            for config in self.attention_configs
        ]

    def _capture_cuda_graphs(self) -> CudaGraphRunner | None:
        if self.device.type != "cuda" or self.args.enforce_eager or self.pooler is not None:
            return None
        if not self.backend_cls.supports_cuda_graphs:
            logger.info(
                "attention backend %s does not support CUDA graphs; running eagerly",
                self.backend_cls.name,
            )
            return None
        graphs = CudaGraphRunner(self, self.args.max_num_seqs)
        graphs.capture()
        return graphs

    def _build_structured_output_manager(self, pm: Any) -> Any:
        """A manager of this process's own (worker processes; the engine shares its own)."""
        from engine.structured_output.setup import build_structured_output_manager
        from engine.tokenization import collect_eos_token_ids

        tokenizer = self.source.load_tokenizer()
        eos_ids = collect_eos_token_ids(tokenizer, self.source.generation_config())
        return build_structured_output_manager(self.args, pm, tokenizer, self.vocab_size, eos_ids)

    def _gate(self, pm: Any, tokenizer: Any) -> ReasoningGate | None:
        from engine.structured_output.setup import resolve_reasoning_parser

        parser_cls = resolve_reasoning_parser(pm, self.args.reasoning_parser)
        return None if parser_cls is None else ReasoningGate(parser_cls(tokenizer), tokenizer)

    # -- one step -------------------------------------------------------------------------

    def execute(self, so: SchedulerOutput) -> ModelRunnerOutput:
        return self.execute_async(so).result()

    @torch.inference_mode()
    def execute_async(
        self, so: SchedulerOutput, defer_sampling: bool = False
    ) -> PendingStep | ReadyStep:
        """Launch the step and return without waiting for the device. The sampled ids stay
        on the device: a later step's placeholder inputs (``PLACEHOLDER_TOKEN_ID``) are
        taken from them. ``defer_sampling``: launch only the forward pass; the caller
        launches the sampling (``PendingStep.launch_sampling``) once the host state it
        reads (output tokens for penalties, grammar matchers) is up to date."""
        for req_id in so.finished_req_ids:
            self._generators.pop(req_id, None)
            self._prompt_logprobs_done.pop(req_id, None)
        self.structured_outputs.drop(so.finished_req_ids)
        self.structured_outputs.drop(so.preempted_req_ids)
        if self.pooler is not None:  # an embedding model: pool, never sample (synchronous)
            self.pooler.drop(so.finished_req_ids)
            return ReadyStep(self.pooler.execute(self, so))
        if so.is_empty:
            return PendingStep(self, None, None, [])
        inputs = self.prepare_inputs(so)
        if self.lora is not None:
            self._set_lora_slots(inputs)
        if inputs.placeholder_rows is not None:
            assert inputs.placeholder_sources is not None and self._prev_sampled is not None
            inputs.input_ids.index_copy_(
                0, inputs.placeholder_rows, self._prev_sampled[inputs.placeholder_sources]
            )
        graph_ids = None  # the decode graph's own tokens (argmax or temperature draw)
        if self.cuda_graphs is not None and self.cuda_graphs.can_run(inputs):
            logits, graph_ids = self.cuda_graphs.run(inputs)
        else:
            logits = self.run_model(inputs, self.kv_caches)
        self._prev_rows = {sr.req_id: i for i, sr in enumerate(inputs.sample_requests)}
        prompt_logprobs = []
        for rows in inputs.prompt_rows:
            first, count = rows.first_row, len(rows.target_token_ids)
            packed = gather_prompt_logprobs(
                logits[first : first + count], rows.target_token_ids, rows.num_logprobs
            )
            prompt_logprobs.append((rows.req_id, rows.num_logprobs, packed))
        step = PendingStep(self, inputs, logits, prompt_logprobs, graph_ids)
        if not defer_sampling:
            step.launch_sampling()
        return step

    @torch.inference_mode()
    def _launch_sampling(
        self, inputs: StepInputs, logits: torch.Tensor, graph_ids: torch.Tensor | None = None
    ) -> DeviceSample | None:
        sample = self.sample(logits, inputs, graph_ids) if inputs.sample_requests else None
        self._prev_sampled = None if sample is None else sample.token_ids
        return sample

    def prepare_inputs(self, so: SchedulerOutput) -> StepInputs:
        lora_slots = None
        if self.lora is not None:
            lora_slots = self.lora.assign([sr.request.lora_request for sr in so.scheduled])
        return self._inputs_builder.build(
            so, self._prompt_logprobs_done, self._prev_rows, lora_slots
        )

    def _set_lora_slots(self, inputs: StepInputs) -> None:
        """Each token's adapter slot into the layers' shared buffer (queued on the stream
        after the step in flight, which still reads the previous step's)."""
        assert self.lora is not None
        context = self.lora.context
        context.active = inputs.lora_active
        if inputs.lora_active and inputs.lora_token_slots is not None:
            num_tokens = inputs.lora_token_slots.shape[0]
            context.token_slots[:num_tokens].copy_(inputs.lora_token_slots, non_blocking=True)

    def run_model(self, inputs: StepInputs, kv_caches: list[torch.Tensor]) -> torch.Tensor:
        """Forward the step; float32 logits [num_logits_rows, vocab] (prompt rows first)."""
        metadata = self.attention_backends[0].build_metadata(inputs.attn_batch)
        hidden = self.model(inputs.input_ids, inputs.positions, kv_caches, metadata)
        return self.model.compute_logits(hidden[inputs.logits_indices])

    def sample(
        self, logits: torch.Tensor, inputs: StepInputs, graph_ids: torch.Tensor | None = None
    ) -> DeviceSample:
        """Sample one token per sampling request from the rows after the prompt rows.
        ``graph_ids``: the tokens the decode graph already drew from ``logits`` (greedy
        rows: the argmax; others: by temperature alone), used when every row is plain
        (``Sampler.plain_rows``)."""
        requests = inputs.sample_requests
        batch = SamplingBatch(
            params=[sr.request.sampling_params for sr in requests],
            generators=[self._generator(sr) for sr in requests],
            prompt_token_ids=[sr.request.prompt_token_ids for sr in requests],
            output_token_ids=[sr.request.output_token_ids for sr in requests],
            allowed_token_masks=self.structured_outputs.masks(
                requests, logits.shape[1], logits.device
            ),
        )
        if graph_ids is not None and self.sampler.plain_rows(batch, logits.shape[1]):
            return self.sampler.greedy_sample(graph_ids, batch)
        return self.sampler.sample_on_device(logits[inputs.num_prompt_rows :], batch)

    def _generator(self, sr: ScheduledRequest) -> torch.Generator | None:
        seed = sr.request.sampling_params.seed
        if seed is None:
            return None
        gen = self._generators.get(sr.req_id)
        if gen is None:
            gen = torch.Generator(device=self.device).manual_seed(seed)
            self._generators[sr.req_id] = gen
        return gen


class ReadyStep:
    """A step whose output was computed synchronously (pooling models)."""

    def __init__(self, output: ModelRunnerOutput) -> None:
        self._output = output

    def launch_sampling(self) -> None:
        pass

    def result(self) -> ModelRunnerOutput:
        return self._output


class PendingStep:
    """A launched step of ``ModelRunner.execute_async``; ``launch_sampling()`` samples it
    (at once unless deferred), ``result()`` waits for its tokens, advances the
    structured-output matchers and returns the ``ModelRunnerOutput``."""

    def __init__(
        self,
        runner: ModelRunner,
        inputs: StepInputs | None,
        logits: torch.Tensor | None,
        prompt_logprobs: list[tuple[ReqId, int, torch.Tensor]],
        graph_ids: torch.Tensor | None = None,
    ) -> None:
        self._runner = runner
        self._inputs = inputs
        self._logits = logits
        self._graph_ids = graph_ids
        self._sample: DeviceSample | None = None
        self._sampled = inputs is None
        self._prompt_logprobs = prompt_logprobs
        packed = [p for _, _, p in prompt_logprobs]
        self._prompt_copy = HostCopy(packed) if packed else None

    def launch_sampling(self) -> None:
        if self._sampled:
            return
        assert self._inputs is not None and self._logits is not None
        self._sample = self._runner._launch_sampling(self._inputs, self._logits, self._graph_ids)
        self._sampled = True
        self._logits = self._graph_ids = None

    def result(self) -> ModelRunnerOutput:
        self.launch_sampling()
        output = ModelRunnerOutput()
        if self._sample is not None:
            assert self._inputs is not None
            sampled = self._sample.to_host()
            requests = self._inputs.sample_requests
            self._runner.structured_outputs.accept(requests, sampled.token_ids)
            for sr, token_id, logprobs in zip(
                requests, sampled.token_ids, sampled.logprobs, strict=True
            ):
                output.sampled_token_ids[sr.req_id] = token_id
                if logprobs is not None:
                    output.logprobs[sr.req_id] = logprobs
        if self._prompt_copy is not None:
            host = self._prompt_copy.wait()
            for (req_id, num_logprobs, _), packed in zip(self._prompt_logprobs, host, strict=True):
                output.prompt_logprobs[req_id] = unpack_prompt_logprobs(packed, num_logprobs)
        return output
