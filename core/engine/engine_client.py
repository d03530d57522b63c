"""The seam between the HTTP API (and ``engine run-batch``) and an engine: ``EngineClient``.

The API layer talks to the engine only through this protocol; it never probes an engine
object's shape with ``getattr``. Three clients implement it:

- ``AsyncLLM`` (``async_llm.py``): the engine runs on a thread of the server's process;
- ``ProcessAsyncLLM`` (``engine_process.py``): the engine runs in its own process and the
  client speaks the pipe protocol (typed updates, errors as codes from ``errors.py``);
- ``DataParallelAsyncLLM`` (``data_parallel.py``): several of the above, one request on one.

The first two are compositions, not a class hierarchy: each owns a ``ClientStreams``
(``client_streams.py``: streams, coalescing, admission, stats snapshot, death) and an
engine link, the part that differs (``ThreadLink``: an engine thread; ``ProcessLink``,
``process_link.py``: the pipe). Model facts come from each one's ``LLMEngine`` (the full
engine, or the engine process's model-less twin). Tests use one shared fake
(``engine.testing.fake_client``).

A route prepares its request once (``prepare``: the front end of ``LLMEngine``, which
tokenizes, validates and fans out several prompts times n) and streams each prepared
prompt (``generate_prepared``); ``generate`` does both for one prompt.

::

    routes ──> serving_* ──> EngineClient ──┬─ AsyncLLM = ClientStreams + ThreadLink
                                            │     └── engine thread ── LLMEngine
                                            ├─ ProcessAsyncLLM = ClientStreams + ProcessLink
                                            │     └══ pipe ══ engine process
                                            └─ DataParallelAsyncLLM ── N of the above
"""

from __future__ import annotations

from collections.abc import AsyncGenerator, Callable, Mapping, Sequence
from typing import TYPE_CHECKING, Any, Protocol, TypedDict

if TYPE_CHECKING:
    from engine.lora.request import LoRARequest
    from engine.model_executor.pooling_task import PoolingConfig
    from engine.outputs import RequestOutput, SchedulerStats
    from engine.outputs_processing.stats import EngineCounters
    from engine.sampling_params import SamplingParams
    from engine.tokenization.input_processor import PreparedRequest, PromptType

__all__ = ["EngineClient", "EngineLoad"]


class EngineLoad(TypedDict):
    """One engine's load, as ``/load`` reports it."""

    engine: int
    num_requests_running: int
    num_requests_waiting: int
    kv_cache_usage: float
    num_requests_added: int
    prefix_cache_hits: int


class EngineClient(Protocol):
    """What the API needs from an engine: requests, admission, stats, health, model facts.

    Every method but ``prepare`` is cheap and safe to call from the event loop's thread.
    """

    # -- the model and its tokenizer ----------------------------------------------------------

    @property
    def tokenizer(self) -> Any: ...

    @property
    def max_model_len(self) -> int: ...

    @property
    def pooling(self) -> PoolingConfig | None:
        """The pooling config of an embedding model; ``None`` for a generating one."""
        ...

    def default_sampling_params(self) -> SamplingParams: ...

    def apply_chat_template(
        self,
        messages: Sequence[Mapping[str, Any]],
        tools: Sequence[Mapping[str, Any]] | None = None,
        add_generation_prompt: bool = True,
        chat_template: str | None = None,
        chat_template_kwargs: Mapping[str, Any] | None = None,
    ) -> str: ...

    # -- requests -----------------------------------------------------------------------------

    def prepare(
        self,
        request_id: str,
        prompts: Sequence[PromptType],
        params: SamplingParams | None = None,
        priority: int = 0,
        cache_salt: str | None = None,
        lora_request: LoRARequest | None = None,
    ) -> list[PreparedRequest]:
        """The front end (``LLMEngine.prepare_requests``): tokenize, validate, apply the
        defaults and fan out, one ``PreparedRequest`` per prompt (ids ``engine.fan_out``).
        Tokenizer work, not cheap: the server runs it in its prepare pool. Bad input raises
        ``RequestValidationError`` whose ``param`` names the field. A structured-output
        constraint gets its cheap checks here (size, bounds; never a compile); the engine
        compiles it later, once, in a worker process, and one too slow or too large to
        compile fails the request's stream with ``RequestValidationError``."""
        ...

    def generate_prepared(self, prepared: PreparedRequest) -> AsyncGenerator[RequestOutput, None]:
        """Stream a prepared request's outputs as ``generate`` does, trusting what
        ``prepare`` checked."""
        ...

    def generate(
        self,
        prompt: PromptType,
        params: SamplingParams | None = None,
        request_id: str | None = None,
        priority: int = 0,
        cache_salt: str | None = None,
        lora_request: LoRARequest | None = None,
    ) -> AsyncGenerator[RequestOutput, None]:
        """Prepare one prompt and stream its outputs until it finishes; closing the
        iterator aborts it. ``lora_request``: the adapter to run with (the engine needs LoRA on).
        Bad input raises ``RequestValidationError`` on the first ``__anext__``, a full
        queue ``QueueFullError``, a dead engine ``EngineDeadError``."""
        ...

    async def abort(self, request_id: str | Sequence[str]) -> None: ...

    # -- admission and statistics -------------------------------------------------------------

    def would_reject(self) -> str | None:
        """Why a new request would meet a full queue now, or ``None``: the server refuses
        before any tokenizer work; the scheduler still enforces the bound exactly."""
        ...

    def stats(self) -> SchedulerStats: ...

    def counters(self) -> EngineCounters: ...

    def engine_loads(self) -> list[EngineLoad]:
        """Each engine's load (one entry per data-parallel engine)."""
        ...

    def add_stats_listener(self, listener: Callable[[Any], None]) -> bool:
        """Call ``listener(IterationStats)`` after each step (register before serving);
        False when this engine reports no iteration stats (then the HTTP layer counts)."""
        ...

    # -- health -------------------------------------------------------------------------------

    @property
    def is_ready(self) -> bool: ...

    @property
    def dead_error(self) -> BaseException | None:
        """Why the engine stopped, or ``None`` while it runs."""
        ...

    def stalled_for(self) -> float:
        """Seconds the engine has had work pending without progress (0 when idle)."""
        ...

    def silent_for(self) -> float:
        """Seconds an idle engine process has sent no heartbeat (0 for an in-process one)."""
        ...

    def declare_dead(self, reason: str) -> None:
        """Fail every request in flight (the watchdog, when the engine is wedged)."""
        ...

    def shutdown(self, timeout: float = 10.0) -> None: ...


def load_of(index: int, client: EngineClient) -> EngineLoad:
    """One engine's ``EngineLoad`` from its stats and counters."""
    stats = client.stats()
    return EngineLoad(
        engine=index,
        num_requests_running=stats.num_running,
        num_requests_waiting=stats.num_waiting,
        kv_cache_usage=stats.kv_cache_usage,
        num_requests_added=client.counters().num_requests_added,
        prefix_cache_hits=stats.prefix_cache_hits,
    )
