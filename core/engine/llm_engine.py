"""The synchronous engine: prompts in, ``RequestOutput`` records out, one step at a time.

``LLMEngine.from_args`` assembles the parts: plugins, model source, model runner (which
plans memory and so knows the number of KV blocks), scheduler + engine core, tokenizer and
the output processor. ``step()`` runs one core step and turns its results into outputs;
the offline ``LLM`` drives it in a loop, ``AsyncLLM`` from a background thread.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import asdict
from typing import TYPE_CHECKING, Any

from engine.config import EngineArgs
from engine.core.engine_core import EngineCore
from engine.core.request import ReqId, RequestStatus
from engine.errors import RequestValidationError
from engine.gc_tuning import settle_after_startup
from engine.generation_config import (
    describe_sampling_defaults,
    merge_sampling_params,
    resolve_sampling_defaults,
    sampling_default_sources,
)
from engine.outputs import RequestOutput, SchedulerStats
from engine.outputs_processing import EngineCounters, IterationStats, OutputProcessor
from engine.sampling_params import SamplingParams, StructuredOutputsParams
from engine.tokenization import apply_chat_template, collect_eos_token_ids
from engine.tokenization.input_processor import InputProcessor, PreparedRequest, PromptType

if TYPE_CHECKING:
    from engine.lora.config import LoRAConfig
    from engine.lora.request import LoRARequest
    from engine.plugins import PluginManager

logger = logging.getLogger(__name__)

StatsListener = Callable[[IterationStats], None]


class LLMEngine:
    """Owns the engine core and the front-end state of every live request."""

    def __init__(
        self,
        engine_core: EngineCore | None,
        tokenizer: Any,
        *,
        max_model_len: int,
        vocab_size: int,
        model_name: str = "model",
        sampling_defaults: Mapping[str, Any] | None = None,
        eos_token_ids: Sequence[int] = (),
        max_logprobs: int = 20,
    ) -> None:
        self.engine_core: Any = engine_core  # None: a front end (see frontend_from_args)
        self.tokenizer = tokenizer
        self.max_model_len = max_model_len
        self.vocab_size = vocab_size
        self.model_name = model_name
        self.sampling_defaults = dict(sampling_defaults or {})
        self.input_processor = InputProcessor(
            tokenizer, max_model_len, vocab_size, list(eos_token_ids), max_logprobs
        )
        self.output_processor = OutputProcessor(tokenizer)
        self._counters = EngineCounters()
        self._stats_listeners: list[StatsListener] = []
        self._last_num_preemptions = 0
        self.runner: Any = getattr(engine_core, "runner", None)
        # Set by from_args: the grammar backend (None: none installed) and the reasoning
        # parser class of --reasoning-parser (the server splits the think section with it).
        self.structured_output_manager: Any = None
        self.reasoning_parser_cls: Any = None
        # An embedding model's PoolingConfig (set by from_args; None: a generating model).
        self.pooling: Any = None
        # LoRA (set by _assemble): the config (None: off), the model's HF config for the
        # adapter shape checks, and the adapters checked so far.
        self.lora_config: LoRAConfig | None = None
        self.hf_config: Any = None
        self._checked_loras: set[tuple[int, str]] = set()
        self._checked_lora_targets: set[int] = set()

    # -- construction -------------------------------------------------------------------------

    @classmethod
    def from_args(cls, args: EngineArgs) -> LLMEngine:
        from engine.core.kv_cache import KVCacheConfig
        from engine.core.scheduler import Scheduler
        from engine.core.scheduler_config import SchedulerConfig
        from engine.model_executor.source import open_model_source
        from engine.plugins import PluginManager

        if not args.model:
            raise ValueError("no model given: pass --model PATH (LLM(model=PATH))")
        pm = PluginManager.load(requested=args.plugins, report_failures=True)
        logger.info("Plugins %s", pm.describe())
        source = open_model_source(args, pm)
        runner = _make_runner(args, pm, source)
        scheduler_config = SchedulerConfig.from_engine_args(args, runner.max_model_len)
        kv_cache_config = KVCacheConfig(
            num_blocks=runner.num_blocks,
            block_size=runner.block_size,
            enable_prefix_caching=args.enable_prefix_caching,
            hash_algo=args.prefix_caching_hash_algo,
        )
        core = EngineCore(
            Scheduler(scheduler_config, kv_cache_config), runner, _async_runner(args, runner)
        )
        engine = cls._assemble(args, pm, source, core, runner.max_model_len, runner.vocab_size)
        engine._log_config(args, scheduler_config, kv_cache_config)
        settle_after_startup()  # freeze the startup objects; fewer young collections
        return engine

    @classmethod
    def frontend_from_args(cls, args: EngineArgs, max_model_len: int, vocab_size: int) -> LLMEngine:
        """The request-side half of an engine whose core runs in another process: tokenizer,
        chat template, sampling defaults, validation and grammar checks; no model, no core
        (``engine_core`` is None). ``max_model_len`` and ``vocab_size`` come from that core.
        """
        from engine.model_executor.source import open_model_source
        from engine.plugins import PluginManager

        pm = PluginManager.load(requested=args.plugins)
        source = open_model_source(args, pm)
        engine = cls._assemble(args, pm, source, None, max_model_len, vocab_size)
        settle_after_startup()
        return engine

    @classmethod
    def _assemble(
        cls, args: EngineArgs, pm: PluginManager, source: Any, core: EngineCore | None,
        max_model_len: int, vocab_size: int,
    ) -> LLMEngine:  # fmt: skip
        """The engine around ``core`` (None: a front end): tokenizer, generation-config
        sampling defaults, EOS ids, structured outputs and the reasoning parser."""
        tokenizer = source.load_tokenizer()
        model_gen_config = source.generation_config()
        defaults = resolve_sampling_defaults(
            args.generation_config, model_gen_config, args.override_generation_config
        )
        sources = sampling_default_sources(
            args.generation_config, model_gen_config, args.override_generation_config
        )
        logger.info(
            "Sampling defaults for fields a request leaves out (--generation-config %s): %s",
            args.generation_config,
            describe_sampling_defaults(defaults, sources),
        )
        engine = cls(
            core,
            tokenizer,
            max_model_len=max_model_len,
            vocab_size=vocab_size,
            model_name=args.model or "model",
            sampling_defaults=defaults,
            eos_token_ids=collect_eos_token_ids(tokenizer, model_gen_config),
            max_logprobs=args.max_logprobs,
        )
        engine._setup_features(args, pm)
        from engine.lora.config import LoRAConfig

        engine.lora_config = LoRAConfig.from_engine_args(args)
        engine.hf_config = source.hf_config
        from engine.model_executor.pooling_task import resolve_pooling

        # Embedding models: requests are prefill-only (pooling_request).
        engine.pooling = resolve_pooling(args, pm, source.hf_config, source.path)
        return engine

    def _setup_features(self, args: EngineArgs, pm: PluginManager) -> None:
        """Structured outputs (one manager, shared with an in-process runner) and the
        reasoning parser; an unknown backend or parser name fails startup."""
        from engine.structured_output.setup import (
            build_structured_output_manager,
            resolve_reasoning_parser,
        )

        self.reasoning_parser_cls = resolve_reasoning_parser(pm, args.reasoning_parser)
        manager = build_structured_output_manager(
            args, pm, self.tokenizer, self.vocab_size, self.input_processor.eos_token_ids
        )
        self.structured_output_manager = manager
        state = getattr(self.runner, "structured_outputs", None)
        if state is not None:
            state.set_manager(manager)
        if manager is not None and self.engine_core is not None:
            # Build the backend's vocabulary and start the compile workers now, off this
            # thread. A front end (engine_core None) only validates: it never compiles.
            manager.warmup()

    def validate_structured_outputs(self, params: StructuredOutputsParams) -> None:
        """Cheap checks of a constraint (size, bounds; never compiles):
        ``RequestValidationError`` (a 400) for a bad one, or when no backend is installed."""
        from engine.structured_output.setup import require_manager

        require_manager(self.structured_output_manager).validate(params)

    def compile_structured_outputs_async(
        self, params: StructuredOutputsParams, timeout_s: float | None = None
    ) -> Any:
        """A ``concurrent.futures.Future`` of the compiled constraint (never blocks; the
        compile runs in a worker process); it fails with ``RequestValidationError`` (a
        400) for a bad, too slow or too large constraint."""
        from engine.structured_output.setup import require_manager

        return require_manager(self.structured_output_manager).compile_async(params, timeout_s)

    def _log_config(self, args: EngineArgs, scheduler_config: Any, kv_cache_config: Any) -> None:
        set_args = {
            k: v for k, v in asdict(args).items() if v != EngineArgs.__dataclass_fields__[k].default
        }
        logger.info("engine arguments (non-default): %s", set_args)
        logger.info("scheduler: %s", scheduler_config)
        logger.info(
            "KV cache: %d blocks of %d tokens (%d tokens), prefix caching %s",
            kv_cache_config.num_blocks,
            kv_cache_config.block_size,
            kv_cache_config.num_blocks * kv_cache_config.block_size,
            "on" if kv_cache_config.enable_prefix_caching else "off",
        )
        logger.info(
            "max_model_len %d, vocab %d, EOS ids %s, sampling defaults %s",
            self.max_model_len,
            self.vocab_size,
            self.input_processor.eos_token_ids,
            self.sampling_defaults or "(neutral)",
        )

    # -- sampling defaults --------------------------------------------------------------------

    def default_sampling_params(self) -> SamplingParams:
        """SamplingParams with the model's defaults (``--generation-config``) applied."""
        return SamplingParams(**self.sampling_defaults)

    def sampling_params_from_request(self, request_fields: Mapping[str, Any]) -> SamplingParams:
        """Merge a request's set fields (None = unset) over the defaults (for the server)."""
        return merge_sampling_params(self.sampling_defaults, request_fields)

    # -- requests -----------------------------------------------------------------------------

    def apply_chat_template(
        self,
        messages: Sequence[Mapping[str, Any]],
        tools: Sequence[Mapping[str, Any]] | None = None,
        add_generation_prompt: bool = True,
        chat_template: str | None = None,
        chat_template_kwargs: Mapping[str, Any] | None = None,
    ) -> str:
        return apply_chat_template(
            self.tokenizer,
            messages,
            tools=tools,
            add_generation_prompt=add_generation_prompt,
            chat_template=chat_template,
            chat_template_kwargs=chat_template_kwargs,
        )

    def prepare_requests(
        self,
        request_id: str,
        prompts: Sequence[PromptType],
        params: SamplingParams | Sequence[SamplingParams | None] | None = None,
        priority: int = 0,
        cache_salt: str | None = None,
        lora_request: LoRARequest | Sequence[LoRARequest | None] | None = None,
    ) -> list[PreparedRequest]:
        """The front end, without touching engine state (safe from any thread): check the
        adapters, apply the sampling defaults, tokenize, validate and fan out, one
        ``PreparedRequest`` per prompt (``engine.fan_out``'s ids); check each constraint
        (the engine compiles it when the request is added). ``params`` and
        ``lora_request``: one for all prompts or one per prompt."""
        num = len(prompts)
        params_list = _per_prompt(params, num, "SamplingParams")
        loras = _per_prompt(lora_request, num, "lora_request")
        for lora in dict.fromkeys(loras):
            if lora is not None:
                self.check_lora_request(lora)
        salts = [cache_salt] * num
        if self.pooling is not None:
            from engine.pooling_request import pooling_request

            # Each prompt its own salt (mean pooling): see pooling_request.
            pooled = [pooling_request(self.pooling, cache_salt) for _ in prompts]
            params_list = [p for p, _ in pooled]
            salts = [salt for _, salt in pooled]
        resolved = [p if p is not None else self.default_sampling_params() for p in params_list]
        prepared = self.input_processor.prepare_all(
            request_id, prompts, resolved, priority, salts, loras
        )
        for constraint in _distinct(p.structured_outputs for p in resolved):
            try:  # checked here, compiled by the engine
                self.validate_structured_outputs(constraint)
            except RequestValidationError as exc:
                raise RequestValidationError(str(exc), "structured_outputs") from None
        return prepared

    def prepare_request(
        self,
        request_id: str,
        prompt: PromptType,
        params: SamplingParams | None = None,
        priority: int = 0,
        cache_salt: str | None = None,
        lora_request: LoRARequest | None = None,
    ) -> PreparedRequest:
        """``prepare_requests`` of one prompt (its id is ``request_id``)."""
        [prepared] = self.prepare_requests(
            request_id, [prompt], params, priority, cache_salt, lora_request
        )
        return prepared

    def add_prepared_request(self, prepared: PreparedRequest) -> None:
        """Queue a prepared request (engine thread only)."""
        lora_request = prepared.lora_request
        if lora_request is not None:
            self._check_lora_targets(lora_request)
        self.output_processor.add_request(
            prepared.request_id,
            prepared.prompt,
            prepared.prompt_token_ids,
            [(r.req_id, r.sampling_params, r) for r in prepared.core_requests],
            prepared.arrival_time,
        )
        added: list[ReqId] = []
        try:
            for request in prepared.core_requests:
                self.engine_core.add_request(request)
                added.append(request.req_id)
        except BaseException:
            self.engine_core.abort_requests(added)
            self.output_processor.abort_requests([prepared.request_id])
            raise
        self._counters.num_requests_added += 1

    def add_prepared_requests(self, prepared: Sequence[PreparedRequest]) -> None:
        """Compile the requests' constraints (all at once, blocking the caller until they
        are ready), then queue them all; on an error none of them stays queued."""
        constraints = _distinct(p.params.structured_outputs for p in prepared)
        compiles = [self.compile_structured_outputs_async(c) for c in constraints]
        for future in compiles:
            future.result()
        added: list[str] = []
        try:
            for p in prepared:
                self.add_prepared_request(p)
                added.append(p.request_id)
        except BaseException:
            self.abort_request(added)
            raise

    def add_request(
        self,
        request_id: str,
        prompt: PromptType,
        params: SamplingParams | None = None,
        priority: int = 0,
        cache_salt: str | None = None,
        lora_request: LoRARequest | None = None,
    ) -> None:
        """Tokenize, validate, compile its constraint (blocking the caller until the grammar
        is ready) and queue a request. ``ValueError`` on bad input."""
        self.add_prepared_requests(
            [self.prepare_request(request_id, prompt, params, priority, cache_salt, lora_request)]
        )

    def check_lora_request(self, lora_request: LoRARequest) -> None:
        """``RequestValidationError`` unless LoRA is on and the adapter fits (checked once
        per adapter id: folder, files, rank, targets, shapes against the model)."""
        from engine.lora.adapter import LoRAAdapterError, check_adapter

        if self.lora_config is None:
            raise RequestValidationError(
                f"request asks for LoRA adapter {lora_request.lora_name!r} but LoRA is off; "
                "start the engine with --enable-lora (LLM(enable_lora=True))"
            )
        key = (lora_request.lora_int_id, lora_request.lora_path)
        if key in self._checked_loras:
            return
        try:
            check_adapter(lora_request, self.lora_config.max_lora_rank, self.hf_config)
        except LoRAAdapterError as exc:
            raise RequestValidationError(str(exc)) from None
        self._checked_loras.add(key)

    def _check_lora_targets(self, lora_request: LoRARequest) -> None:
        """Where the runner is in this process (the engine side): the adapter's modules
        are projections the model runs with LoRA slots, so a bad adapter fails its request
        here, never a step. Checked once per adapter id."""
        slots = getattr(self.runner, "lora", None)
        if slots is None or lora_request.lora_int_id in self._checked_lora_targets:
            return
        from engine.lora.adapter import LoRAAdapterError, check_targets

        try:
            check_targets(lora_request, slots.servable, type(self.runner.model).__name__)
        except (LoRAAdapterError, OSError) as exc:
            raise RequestValidationError(str(exc)) from None
        self._checked_lora_targets.add(lora_request.lora_int_id)

    def abort_request(self, request_id: str | Sequence[str]) -> list[RequestOutput]:
        """Abort user requests (unknown ids are ignored); frees their blocks at once."""
        ids = [request_id] if isinstance(request_id, str) else list(request_id)
        it = IterationStats(scheduler=None)
        outputs, core_ids = self.output_processor.abort_requests(ids, it)
        if core_ids:
            self.engine_core.abort_requests([ReqId(i) for i in core_ids])
        self._publish(it)
        return outputs

    def fail_all_requests(self, error: str) -> list[RequestOutput]:
        """Finish every live request with an error (after a failed step)."""
        it = IterationStats(scheduler=None)
        outputs, core_ids = self.output_processor.abort_requests(
            self.output_processor.all_request_ids(), it, reason="error", error=error
        )
        if core_ids:
            self.engine_core.finish_requests(
                [ReqId(i) for i in core_ids], RequestStatus.FINISHED_ERROR
            )
        self._publish(it)
        return outputs

    def has_unfinished_requests(self) -> bool:
        return self.engine_core.has_unfinished_requests()

    def get_num_unfinished_requests(self) -> int:
        return self.output_processor.get_num_unfinished_requests()

    # -- stepping -----------------------------------------------------------------------------

    def step(self) -> list[RequestOutput]:
        """One engine step; the outputs of every request that changed."""
        core_outputs = self.engine_core.step()
        it = IterationStats(scheduler=None)
        processed = self.output_processor.process_outputs(core_outputs, it)
        if processed.req_ids_to_finish:
            self.engine_core.finish_requests(
                [ReqId(i) for i in processed.req_ids_to_finish], RequestStatus.FINISHED_STOPPED
            )
        self._publish(it)
        return processed.request_outputs

    # -- stats --------------------------------------------------------------------------------

    def stats(self) -> SchedulerStats:
        return self.engine_core.stats()

    def counters(self) -> EngineCounters:
        """Running totals (prompt/generation tokens, preemptions, finished by reason)."""
        return self._counters.snapshot()

    def add_stats_listener(self, listener: StatsListener) -> None:
        """Call ``listener(IterationStats)`` after every step (from the engine's thread)."""
        self._stats_listeners.append(listener)

    def _publish(self, it: IterationStats) -> None:
        it.scheduler = self.engine_core.stats()
        num_preemptions = it.scheduler.num_preemptions
        it.num_preemptions = num_preemptions - self._last_num_preemptions
        self._last_num_preemptions = num_preemptions
        self._counters.add(it)
        for listener in self._stats_listeners:
            try:
                listener(it)
            except Exception:
                logger.exception("stats listener %r failed; continuing", listener)


def _async_runner(args: EngineArgs, runner: Any) -> Any:
    """The runner when it steps asynchronously (``--async-scheduling``, one process), else
    None. Tensor-parallel workers each sample, so a placeholder would need the same token on
    every rank; they step synchronously."""
    from engine.model_executor.runner import ModelRunner

    if not args.async_scheduling:
        logger.info("async scheduling off (--no-async-scheduling)")
        return None
    if not isinstance(runner, ModelRunner):
        logger.info("async scheduling off: %s steps synchronously", type(runner).__name__)
        return None
    if runner.pooler is not None:
        logger.info("async scheduling off: a pooling model steps synchronously")
        return None
    logger.info("async scheduling on: the next step is prepared while the device runs one")
    return runner


def _make_runner(args: EngineArgs, pm: PluginManager, source: Any) -> Any:
    """The ``ModelRunner`` itself, or worker processes for ``--tensor-parallel-size`` > 1."""
    from engine.executor import build_executor

    return build_executor(args, pm, source)


def _per_prompt(value: Any, num_prompts: int, name: str) -> list[Any]:
    """``value`` for each prompt: a single value (or None) repeated, or a list of one per
    prompt."""
    if value is None or not isinstance(value, Sequence):
        return [value] * num_prompts
    values = list(value)
    if len(values) != num_prompts:
        raise ValueError(
            f"got {len(values)} {name} for {num_prompts} prompts; pass one for all prompts "
            "or exactly one per prompt"
        )
    return values


def _distinct(
    constraints: Iterable[StructuredOutputsParams | None],
) -> list[StructuredOutputsParams]:
    """The constraints, each object once (a request's prompts share their params' one)."""
    return list({id(c): c for c in constraints if c is not None}.values())
