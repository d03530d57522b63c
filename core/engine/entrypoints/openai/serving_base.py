"""What the generating routes share: model names, sampling parameters, the engine's front
end (``prepare_prompts``: tokenize, validate, fan out; in the prepare pool), and running
engine requests so that a vanished client aborts them.

``EngineStream`` runs one prepared prompt (``engine.generate_prepared``): closing it
(client gone, SIGTERM drain timeout, an error) aborts the request in the engine, which
frees its KV blocks at once (all n samples of the prompt).
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import logging
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, TypeVar

import anyio
from fastapi import Request

from engine.engine_client import EngineClient
from engine.entrypoints.openai.errors import (
    APIError,
    internal_error,
    invalid_request,
    model_not_found,
    queue_full,
)
from engine.entrypoints.openai.metrics import ServerMetrics
from engine.entrypoints.openai.protocol import SamplingFields
from engine.errors import EngineDeadError, EngineError, QueueFullError
from engine.outputs import RequestOutput
from engine.sampling_params import RequestOutputKind, SamplingParams
from engine.tokenization.input_processor import PreparedRequest, PromptType

if TYPE_CHECKING:
    from engine.lora.registry import LoRARegistry
    from engine.lora.request import LoRARequest

logger = logging.getLogger("engine.server")
T = TypeVar("T")


class ClientDisconnected(Exception):
    """The HTTP client went away before its response was ready."""


@dataclass
class InflightRequests:
    """Engine requests in progress, so SIGTERM can wait for them or abort them."""

    streams: dict[str, EngineStream] = field(default_factory=dict)
    draining: bool = False

    def __len__(self) -> int:
        return len(self.streams)

    def count_by_kind(self) -> dict[str, int]:
        """In-flight engine requests per route kind (``EngineStream.kind``)."""
        counts: dict[str, int] = {}
        for stream in self.streams.values():
            counts[stream.kind] = counts.get(stream.kind, 0) + 1
        return counts

    async def abort_all(self) -> None:
        for stream in list(self.streams.values()):
            stream.aborted_by_server = True
            await stream.abort()


@dataclass
class ServingContext:
    engine: EngineClient
    served_model_names: list[str]
    metrics: ServerMetrics
    log_requests: bool = False
    max_logprobs: int = 20
    inflight: InflightRequests = field(default_factory=InflightRequests)
    # Tool-call and reasoning parsers (chat_features.ChatFeatures; None: parse nothing).
    features: Any = None
    # Template rendering and tokenization run off the event loop, each within this deadline.
    prepare_timeout_s: float = 10.0
    max_prepare_workers: int = 4
    max_prepare_queue: int = 1024
    # LoRA adapters served by name (engine.lora.registry.LoRARegistry; None: LoRA off).
    lora: LoRARegistry | None = None
    _num_prepare_pending: int = field(default=0, init=False, repr=False)
    _prepare_pool: concurrent.futures.ThreadPoolExecutor | None = field(
        default=None, init=False, repr=False
    )

    async def run_prepare(self, fn: Callable[..., T], *args: Any) -> T:
        """``fn(*args)`` in the prepare thread pool; 400 once it exceeds the deadline.

        A thread cannot be stopped, so a runaway render keeps its worker until it ends; the
        pool is bounded (``max_prepare_workers``), so such renders cannot multiply threads.
        A job still queued at its deadline is cancelled rather than run later, and at most
        ``max_prepare_queue`` jobs wait at once (more: 503), so work cannot pile up behind
        slow ones.
        """
        if self._prepare_pool is None:
            self._prepare_pool = concurrent.futures.ThreadPoolExecutor(
                self.max_prepare_workers, thread_name_prefix="prepare"
            )
        if self._num_prepare_pending >= self.max_prepare_workers + self.max_prepare_queue:
            raise queue_full(
                f"{self._num_prepare_pending} requests are waiting for template rendering "
                "and tokenization"
            )
        job = self._prepare_pool.submit(fn, *args)
        self._num_prepare_pending += 1
        loop = asyncio.get_running_loop()

        def settled(_: Any) -> None:
            loop.call_soon_threadsafe(self._prepare_done)

        job.add_done_callback(settled)
        try:
            return await asyncio.wait_for(asyncio.wrap_future(job), self.prepare_timeout_s)
        except TimeoutError:
            job.cancel()  # still queued: dropped; already running: runs to its end
            raise APIError(
                f"chat template rendering and tokenization exceeded {self.prepare_timeout_s:g} s "
                "(the server's --request-prepare-timeout); shorten the messages or the prompt",
                400,
                "messages",
                "prepare_timeout",
            ) from None

    def _prepare_done(self) -> None:
        self._num_prepare_pending -= 1

    def would_reject(self) -> str | None:
        """Why a new request would be refused for a full queue (cheap; before any work)."""
        return self.engine.would_reject()

    @property
    def tokenizer(self) -> Any:
        return self.engine.tokenizer

    @property
    def max_model_len(self) -> int:
        return int(self.engine.max_model_len)

    def resolve_model(self, name: str | None) -> str:
        """The served name a request's ``model`` selects (a base model name or a LoRA
        adapter's); 404 listing the served names for any other."""
        if name is None or name == "":
            return self.served_model_names[0]
        if name in self.served_model_names:
            return name
        if self.lora is not None and self.lora.get(name) is not None:
            return name
        raise model_not_found(name, self.model_names())

    def model_names(self) -> list[str]:
        """Every name a request may send: base model names, then adapters."""
        adapters = self.lora.names() if self.lora is not None else []
        return [*self.served_model_names, *adapters]

    def lora_request_for(self, model: str | None) -> LoRARequest | None:
        """The adapter a resolved model name selects (None: the base model). An adapter
        unloaded since the name was resolved is a 404."""
        if self.lora is None or model is None or model in self.served_model_names:
            return None
        request = self.lora.get(model)
        if request is None:
            raise model_not_found(model, self.model_names())
        return request


def new_request_id(request: Request) -> str:
    given = getattr(request.state, "request_id", None)
    return str(given) if given else uuid.uuid4().hex


def build_sampling_params(
    req: SamplingFields,
    defaults: SamplingParams,
    max_tokens: int | None,
    logprobs: int | None,
    prompt_logprobs: int | None = None,
) -> SamplingParams:
    """Request fields over the model's defaults (``max_tokens`` None: as many as fit).
    The engine's front end validates them (``prepare_prompts``)."""
    changes: dict[str, Any] = {
        "n": req.n,
        "max_tokens": max_tokens,
        "min_tokens": req.min_tokens,
        "seed": req.seed,
        "ignore_eos": req.ignore_eos,
        "include_stop_str_in_output": req.include_stop_str_in_output,
        "skip_special_tokens": req.skip_special_tokens,
        "logprobs": logprobs,
        "prompt_logprobs": prompt_logprobs,
    }
    for name in (
        "temperature",
        "top_p",
        "top_k",
        "min_p",
        "presence_penalty",
        "frequency_penalty",
        "repetition_penalty",
    ):
        value = getattr(req, name)
        if value is not None:
            changes[name] = value
    if req.stop is not None:
        changes["stop"] = [req.stop] if isinstance(req.stop, str) else list(req.stop)
    if req.stop_token_ids is not None:
        changes["stop_token_ids"] = list(req.stop_token_ids)
    if req.logit_bias:  # keys checked by validation.py
        changes["logit_bias"] = {int(k): float(v) for k, v in req.logit_bias.items()}
    params = defaults.clone(**changes)
    if params.top_k == -1:
        params.top_k = 0
    return params


def prepare_prompts(
    ctx: ServingContext,
    request_id: str,
    prompts: Sequence[PromptType],
    params: SamplingParams,
    priority: int = 0,
    cache_salt: str | None = None,
    model: str | None = None,
    prompt_field: str = "prompt",
) -> list[PreparedRequest]:
    """The engine's front end for a route (run it in the prepare pool): one prepared request
    per prompt (ids ``{request_id}-{p}`` for several), its n samples fanned out, with the
    adapter ``model`` names; 400 naming the field (the prompt as ``prompt_field``)."""
    lora_request = ctx.lora_request_for(model)
    try:
        return ctx.engine.prepare(request_id, prompts, params, priority, cache_salt, lora_request)
    except ValueError as exc:  # RequestValidationError: param names the field
        raise invalid_request(exc, prompt_field) from None


class EngineStream:
    """One prepared prompt as an async iterator; ``close`` aborts it if unfinished."""

    def __init__(
        self, ctx: ServingContext, prepared: PreparedRequest, model: str | None = None
    ) -> None:
        req_id = prepared.request_id
        if req_id in ctx.inflight.streams:
            raise APIError(
                f"A request with id {req_id!r} is already running; send a unique X-Request-Id.",
                409,
            )
        # ``model``: the resolved name. The adapter it names counts as in use (not
        # unloadable) until the request ends; one unloaded or replaced since the request
        # was prepared is a 404.
        lora_request = ctx.lora_request_for(model)
        if lora_request != prepared.lora_request:
            raise model_not_found(model or "", ctx.model_names())
        self.ctx = ctx
        self.req_id = req_id
        self.finished = False
        self.aborted_by_server = False
        self.kind = "generate"  # what /load counts it as (set by the route that made it)
        # Deltas: ChoiceState sums a choice's text once; nothing is re-joined per step.
        prepared.set_output_kind(RequestOutputKind.DELTA)
        self.lora_request = lora_request
        self._gen = ctx.engine.generate_prepared(prepared)
        if self.lora_request is not None and ctx.lora is not None:
            ctx.lora.acquire(self.lora_request)
        ctx.inflight.streams[req_id] = self

    def __aiter__(self) -> EngineStream:
        return self

    async def __anext__(self) -> RequestOutput:
        try:
            out: RequestOutput = await self._gen.__anext__()
        except (StopAsyncIteration, QueueFullError, APIError):
            raise
        except ValueError as exc:  # RequestValidationError from the engine: bad input
            self.finished = True
            raise invalid_request(exc) from None
        except EngineError as exc:
            self.finished = True
            if isinstance(exc, EngineDeadError):
                logger.error("request %s: engine not running: %s", self.req_id, exc)
                raise APIError(
                    "The engine is not running; retry on another replica.", 503
                ) from None
            logger.error("request %s failed in the engine: %s", self.req_id, exc)
            raise internal_error(self.req_id) from None
        except Exception:
            self.finished = True
            logger.exception("request %s failed in the engine", self.req_id)
            raise internal_error(self.req_id) from None
        if out.finished:
            self.finished = True
            self._release_lora()
        return out

    def _release_lora(self) -> None:
        if self.lora_request is not None and self.ctx.lora is not None:
            self.ctx.lora.release(self.lora_request)
            self.lora_request = None

    async def abort(self) -> None:
        if not self.finished:
            with anyio.CancelScope(shield=True):
                await self.ctx.engine.abort(self.req_id)

    async def close(self) -> None:
        """Release the request: abort it in the engine unless it finished."""
        self.ctx.inflight.streams.pop(self.req_id, None)
        self._release_lora()
        with anyio.CancelScope(shield=True):
            try:
                await self._gen.aclose()
            except Exception:  # closing must not mask the original error
                logger.debug("closing request %s failed", self.req_id, exc_info=True)
            if not self.finished:
                await self.abort()


async def first_output(stream: EngineStream) -> RequestOutput | None:
    """The first engine output (errors such as a full queue surface here, before headers)."""
    try:
        return await stream.__anext__()
    except StopAsyncIteration:
        return None


async def outputs_from(
    stream: EngineStream, first: RequestOutput | None
) -> AsyncIterator[RequestOutput]:
    """``first`` (already taken) followed by the rest of the stream, up to the final one."""
    if first is None:
        return
    yield first
    if first.finished:
        return
    async for out in stream:
        yield out
        if out.finished:
            return


async def open_streams(
    ctx: ServingContext, prepared: Sequence[PreparedRequest], model: str | None, kind: str
) -> list[EngineStream]:
    """One ``EngineStream`` per prepared prompt (all, or none: those opened are closed)."""
    streams: list[EngineStream] = []
    try:
        for p in prepared:
            stream = EngineStream(ctx, p, model)
            stream.kind = kind
            streams.append(stream)
    except BaseException:
        await close_all(streams)
        raise
    return streams


async def close_all(streams: list[EngineStream]) -> None:
    for stream in streams:
        await stream.close()


async def until_disconnected(request: Request, work: Awaitable[T], poll_s: float = 0.25) -> T:
    """Await ``work``; cancel it and raise ``ClientDisconnected`` if the client leaves."""
    task = asyncio.ensure_future(work)
    try:
        while True:
            done, _ = await asyncio.wait({task}, timeout=poll_s)
            if done:
                return task.result()
            if await request.is_disconnected():
                raise ClientDisconnected()
    finally:
        if not task.done():
            task.cancel()
            with anyio.CancelScope(shield=True):
                try:
                    await task
                except BaseException:  # noqa: S110 - the cancellation we asked for
                    pass
