"""``StructuredOutputManager``: one grammar backend, its compile cache and the per-step masks.

Each constraint is checked where it enters and compiled in one place:

- ``validate``: cheap checks on the spec text (size, bounds, a repeat of a refused one);
  what an API server process does (it never compiles);
- ``compile_async``: the engine's compile, in a killable, memory-capped worker process
  (``compile_worker.py``), with a deadline, once per constraint (cached; a failed one is
  refused on repeats). Errors are ``RequestValidationError`` (HTTP 400).

The runner then keeps one matcher per constrained request (``matcher_for``, a cache hit,
bound to its grammar's serial: ``bound_matcher.py``), asks for the batch's masks each step
(``packed_masks``: rows of the mask table, ``mask_table.py``; ``batch_masks``: bool masks
on the host, for tools and tests) and feeds back each sampled token (``accept_token``).
See ``engine.structured_output`` for the wiring.
"""

from __future__ import annotations

import threading
from collections.abc import Sequence
from concurrent.futures import Future
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import torch
from engine_sdk.interfaces.structured_output import (
    CompiledGrammar,
    GrammarMatcher,
    StructuredOutputBackend,
)
from engine_sdk.specs import StructuredOutputBackendSpec

from engine.errors import RequestValidationError, StartupError
from engine.plugins.errors import PluginError
from engine.sampling_params import StructuredOutputsParams
from engine.structured_output.bound_matcher import GrammarSerials
from engine.structured_output.bounds import check_bounds
from engine.structured_output.cache import GrammarCache, RefusedGrammars, grammar_num_bytes
from engine.structured_output.compile_worker import (
    BackendPayload,
    CompileAbandoned,
    CompileLimitError,
    CompileWorkerPool,
)
from engine.structured_output.config import StructuredOutputsConfig
from engine.structured_output.deadlines import with_deadline
from engine.structured_output.keys import GrammarKey, grammar_key
from engine.structured_output.mask_table import MAX_ROWS, PackedMaskTable
from engine.structured_output.masks import EosRules, PackedMasks, batch_masks

if TYPE_CHECKING:
    from engine.plugins import PluginManager

KIND = StructuredOutputBackendSpec.kind


def select_backend(registry: Any, name: str) -> StructuredOutputBackendSpec:
    """The spec named ``name``, or the highest-priority one for ``auto``."""
    specs = [s for s in registry.specs(KIND) if isinstance(s, StructuredOutputBackendSpec)]
    if not specs:
        raise StartupError(
            "no structured output backend is installed; pip install engine-outlines "
            "(or another plugin registering a structured_output_backend)"
        )
    if name == "auto":
        return sorted(specs, key=lambda s: (-s.priority, s.name))[0]
    for spec in specs:
        if spec.name == name:
            return spec
    installed = ", ".join(sorted(s.name for s in specs))
    raise StartupError(
        f"structured output backend {name!r} is not installed; installed: {installed}. "
        "Set structured_outputs_config.backend to one of them or to auto"
    )


def _completed(result: Any = None, error: BaseException | None = None) -> Future[Any]:
    future: Future[Any] = Future()
    if error is not None:
        future.set_exception(error)
    else:
        future.set_result(result)
    return future


@dataclass
class _InFlight:
    """A compile in progress and the callers' deadline futures waiting on it."""

    inner: Future[CompiledGrammar] | None = None
    waiters: list[Future[CompiledGrammar]] = field(default_factory=list)


class StructuredOutputManager:
    """Compiles constraints (cached, off-thread, with a deadline) and builds token masks."""

    def __init__(
        self,
        tokenizer: Any,
        vocab_size: int,
        pm: PluginManager,
        backend_name: str | None = None,
        *,
        config: StructuredOutputsConfig | None = None,
        eos_token_ids: Sequence[int] | None = None,
    ) -> None:
        self.config = config or StructuredOutputsConfig()
        self.tokenizer = tokenizer
        self.vocab_size = vocab_size
        self.spec = select_backend(pm.registry, backend_name or self.config.backend)
        try:
            self._backend_cls: type[StructuredOutputBackend] = pm.registry.resolve(
                KIND, self.spec.name
            )
        except PluginError as exc:
            raise StartupError(str(exc)) from exc
        tokenizer_eos = getattr(tokenizer, "eos_token_id", None)
        eos_ids = list(eos_token_ids or [])
        if tokenizer_eos is not None:
            eos_ids.append(int(tokenizer_eos))
        self.eos_rules = EosRules(eos_ids)
        self._mask_tables: dict[tuple[torch.device, int], PackedMaskTable] = {}
        self.max_mask_rows = MAX_ROWS
        self._serials = GrammarSerials()
        self.cache = GrammarCache(self.config.max_cache_entries, self.config.max_cache_bytes)
        self.refused = RefusedGrammars()
        self._pool: CompileWorkerPool | None = None  # started on the first compile
        self.num_compiles = 0  # compiles sent to the workers (not cache hits)
        self._lock = threading.RLock()
        self._in_flight: dict[GrammarKey, _InFlight] = {}
        self._backend: StructuredOutputBackend | None = None
        self._backend_error: BaseException | None = None
        self._backend_lock = threading.Lock()

    @property
    def backend_name(self) -> str:
        return self.spec.name

    # -- the backend (built on first use, then pickled once for each compile worker) -------

    def get_backend(self) -> StructuredOutputBackend:
        """The backend instance, built on first use (blocks while it builds). The engine's
        process keeps it only to hand its vocabulary to the compile workers."""
        with self._backend_lock:
            if self._backend is None and self._backend_error is None:
                try:
                    self._backend = self._backend_cls(self.tokenizer, self.vocab_size)
                except Exception as exc:
                    self._backend_error = exc
            if self._backend_error is not None:
                raise StartupError(
                    f"structured output backend {self.spec.name!r} cannot start for this "
                    f"model: {type(self._backend_error).__name__}: {self._backend_error}"
                ) from self._backend_error
            assert self._backend is not None
            return self._backend

    def _workers(self) -> CompileWorkerPool:
        with self._lock:
            if self._pool is None:
                self._pool = CompileWorkerPool(
                    lambda: BackendPayload.of(self.get_backend()),
                    self.config.num_compile_workers,
                    self.config.compile_timeout_s,
                    self.config.compile_memory_bytes,
                )
            return self._pool

    def warmup(self, params: Sequence[StructuredOutputsParams] = ()) -> Future[None]:
        """Build the backend (its vocabulary) and start the compile workers now, on a
        background thread, rather than on first use; then compile ``params`` (for example
        ``json_object``, which every server answering ``response_format={"type":
        "json_object"}`` needs) into the cache."""
        done: Future[None] = Future()

        def build() -> None:
            try:
                pool = self._workers()
                pool.payload()
                for started in pool.start_workers():
                    started.result()
                for one in params:
                    self.compile(one)
            except BaseException as exc:  # noqa: BLE001 - delivered to the caller
                done.set_exception(exc)
            else:
                done.set_result(None)

        threading.Thread(target=build, name="engine-grammar-warmup", daemon=True).start()
        return done

    # -- checking and compiling -------------------------------------------------------------

    def validate(self, params: StructuredOutputsParams) -> GrammarKey:
        """The constraint's key; ``RequestValidationError`` (a 400) for a malformed,
        oversized or over-bound spec, or one whose compile already failed here. Cheap
        (microseconds; never compiles): what an API server process runs."""
        key = grammar_key(params, self.config.max_spec_chars)
        check_bounds(key.kind, key.canonical, self.config.max_repeat, self.config.max_schema_depth)
        reason = self.refused.get(key)
        if reason is not None:  # compiled once already, and failed
            raise RequestValidationError(reason)
        return key

    def compile_async(
        self, params: StructuredOutputsParams, timeout_s: float | None = None
    ) -> Future[CompiledGrammar]:
        """A future of the compiled constraint; never blocks and never raises.

        The future fails with ``RequestValidationError`` for an invalid constraint or when
        compiling takes longer than ``timeout_s`` (default ``config.compile_timeout_s``)
        or more memory than ``config.compile_memory_bytes``.
        """
        timeout = self.config.compile_timeout_s if timeout_s is None else timeout_s
        try:
            key = self.validate(params)
        except RequestValidationError as exc:
            return _completed(error=exc)
        cached = self.cache.get(key)
        if cached is not None:
            return _completed(cached)
        with self._lock:
            flight = self._in_flight.get(key)
            if flight is None:
                reason = self.refused.get(key)
                if reason is not None:  # failed while this caller was validating
                    return _completed(error=RequestValidationError(reason))
                flight = _InFlight()
                self._in_flight[key] = flight
                flight.inner = self._submit(key, flight)
            assert flight.inner is not None
            outer = with_deadline(flight.inner, timeout, lambda: _timeout_error(key, timeout))
            flight.waiters.append(outer)
        return outer

    def compile(
        self, params: StructuredOutputsParams, timeout_s: float | None = None
    ) -> CompiledGrammar:
        """``compile_async(...).result()``: blocks the caller (not for the engine loop)."""
        return self.compile_async(params, timeout_s).result()

    def _submit(self, key: GrammarKey, flight: _InFlight) -> Future[CompiledGrammar]:
        """Send ``key`` to a worker; the returned future holds the cached grammar or the
        request error (recorded as refused, so a repeat is refused without compiling)."""
        inner: Future[CompiledGrammar] = Future()
        raw = self._workers().submit(key.kind, key.backend_spec(), lambda: self._claim(key, flight))
        self.num_compiles += 1

        def finish(done: Future[Any]) -> None:
            try:
                inner.set_result(self._admit(key, done.result()))
            except CompileAbandoned as exc:
                self.num_compiles -= 1
                inner.set_exception(exc)
            except (ValueError, TypeError, CompileLimitError) as exc:
                error = self._refusal(key, exc)
                self.refused.add(key, str(error))
                inner.set_exception(error)
            except BaseException as exc:  # noqa: BLE001 - a worker that cannot start
                inner.set_exception(exc)
            finally:
                self._forget(key, flight)

        raw.add_done_callback(finish)
        return inner

    def _admit(self, key: GrammarKey, grammar: CompiledGrammar) -> CompiledGrammar:
        if not self.cache.put(key, grammar) and self.cache.max_entries > 0:
            # Too large for the whole cache: every repeat would build it again, and memory
            # would ratchet up by its size each time. Refuse it, now and on repeats.
            raise ValueError(
                f"the compiled grammar takes {grammar_num_bytes(grammar)} bytes, more than "
                f"the server's whole grammar cache ({self.cache.max_bytes} bytes); simplify "
                "the constraint (bounded repetitions, fewer alternatives)"
            )
        return grammar

    def _refusal(self, key: GrammarKey, exc: BaseException) -> RequestValidationError:
        if not isinstance(exc, CompileLimitError):
            return RequestValidationError(f"structured_outputs.{key.kind}: {exc}")
        if exc.reason == "timeout":
            return _timeout_error(key, self.config.compile_timeout_s)
        if exc.reason == "crashed":
            return RequestValidationError(
                f"structured_outputs.{key.kind}: the grammar compiler stopped unexpectedly on "
                "this constraint; simplify it or send a different one"
            )
        return RequestValidationError(
            f"structured_outputs.{key.kind}: compiling the constraint needed more than "
            f"{self.config.compile_memory_bytes} bytes of memory and was stopped; simplify "
            "the constraint (fewer optional fields or alternatives, bounded repetitions), "
            "or the operator can raise --structured-outputs-config.compile-memory-bytes"
        )

    def _claim(self, key: GrammarKey, flight: _InFlight) -> bool:
        """Run the queued compile unless every caller already gave up on it."""
        with self._lock:
            if flight.waiters and all(w.done() for w in flight.waiters):
                if self._in_flight.get(key) is flight:
                    del self._in_flight[key]
                return False
            return True

    def _forget(self, key: GrammarKey, flight: _InFlight) -> None:
        with self._lock:
            if self._in_flight.get(key) is flight:
                del self._in_flight[key]

    def num_in_flight(self) -> int:
        return len(self._in_flight)

    # -- per-request state and per-step masks ---------------------------------------------

    def new_matcher(self, compiled: CompiledGrammar) -> GrammarMatcher:
        """A matcher of ``compiled`` bound to the grammar's identity (its masks are then
        shared with every request of that grammar in the same state)."""
        return self._serials.bind(compiled)

    def matcher_for(
        self, params: StructuredOutputsParams, token_ids: Sequence[int] = ()
    ) -> GrammarMatcher:
        """A matcher for ``params`` advanced over ``token_ids`` (already generated tokens,
        e.g. after preemption). Compiles synchronously on a cache miss."""
        matcher = self.new_matcher(self.compile(params))
        for i, token_id in enumerate(token_ids):
            if not self.accept_token(matcher, token_id):
                raise RequestValidationError(
                    f"structured_outputs: token {token_id} at output position {i} does not "
                    "fit the constraint"
                )
        return matcher

    def accept_token(self, matcher: GrammarMatcher, token_id: int) -> bool:
        """Advance ``matcher`` by a sampled token. An EOS id is accepted where the grammar
        may end and does not advance the backend (the request finishes on it)."""
        if self.eos_rules.is_eos(token_id):
            if matcher.is_terminated():
                return True
            mask = matcher.allowed_token_ids()
            return mask is None or self.eos_rules.may_end(mask) or not bool(mask.any())
        return matcher.accept_token(token_id)

    def batch_masks(
        self,
        matchers: Sequence[GrammarMatcher | None],
        vocab_size: int | None = None,
        device: torch.device | str = "cpu",
    ) -> list[torch.Tensor | None]:
        """Bool ``[vocab_size]`` per row (``None``: unconstrained) for
        ``SamplingBatch.allowed_token_masks``; keep ``device="cpu"``: the sampler copies
        the whole batch to the GPU at once."""
        return batch_masks(matchers, vocab_size or self.vocab_size, self.eos_rules, device)

    def packed_masks(
        self, matchers: Sequence[GrammarMatcher | None], vocab_size: int, device: torch.device
    ) -> PackedMasks:
        """The same masks as ``batch_masks``, as packed bits on ``device`` (an
        unconstrained row allows every id), built once per grammar state: see
        ``PackedMaskTable``."""
        return self.mask_table(vocab_size, device).lookup(matchers)

    def mask_table(self, vocab_size: int, device: torch.device) -> PackedMaskTable:
        table = self._mask_tables.get((device, vocab_size))
        if table is None:
            table = PackedMaskTable(
                self.eos_rules, device, vocab_size, self.vocab_size, self.max_mask_rows
            )
            self._mask_tables[(device, vocab_size)] = table
        return table

    def worker_pids(self) -> list[int | None]:
        """The compile workers' process ids (``None``: not running); for tests and tools."""
        return [] if self._pool is None else self._pool.worker_pids()

    def close(self) -> None:
        """Stop the compile workers (a compile in progress is killed)."""
        if self._pool is not None:
            self._pool.kill_now()


def _timeout_error(key: GrammarKey, timeout_s: float) -> RequestValidationError:
    return RequestValidationError(
        f"structured_outputs.{key.kind}: compiling the constraint took longer than "
        f"{timeout_s:g} s; simplify the constraint (fewer optional fields or "
        "alternatives, bounded repetitions), or the operator can raise "
        "--structured-outputs-config.compile-timeout-s"
    )
