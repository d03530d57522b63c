"""Compiling off the engine loop: a few daemon worker threads and per-caller deadlines.

A compile cannot be interrupted (the backend runs native code), so a deadline fails the
*caller's* future and leaves the compile running; its result is still cached when it
ends. Two things keep runaway compiles from piling up: a job whose callers have all given
up before it starts is skipped (``should_run``), and the pool has a fixed number of
threads. The threads are daemons, so a compile never holds up interpreter exit.

::

    caller ── compile_async ──> outer Future ◄── first of: inner done | timer fires
                                    ▲
    queue ─> worker thread ─> inner Future (shared by callers of the same key)
"""

from __future__ import annotations

import queue
import threading
from collections.abc import Callable
from concurrent.futures import Future, InvalidStateError
from typing import Any, TypeVar

T = TypeVar("T")


class CompileAbandoned(Exception):
    """Every caller of a queued compile gave up before it started, so it did not run."""


class CompilePool:
    """``num_workers`` daemon threads running submitted jobs in FIFO order."""

    def __init__(self, num_workers: int, name: str = "engine-grammar") -> None:
        self._jobs: queue.SimpleQueue[Any] = queue.SimpleQueue()
        self._threads = [
            threading.Thread(target=self._work, name=f"{name}-{i}", daemon=True)
            for i in range(num_workers)
        ]
        self._closed = False
        for thread in self._threads:
            thread.start()

    def submit(
        self, fn: Callable[[], T], should_run: Callable[[], bool] = lambda: True
    ) -> Future[T]:
        if self._closed:
            raise RuntimeError("the grammar compile pool is closed")
        future: Future[T] = Future()
        self._jobs.put((future, fn, should_run))
        return future

    def _work(self) -> None:
        while True:
            job = self._jobs.get()
            if job is None:
                return
            future, fn, should_run = job
            if not future.set_running_or_notify_cancel():
                continue
            if not should_run():
                future.set_exception(CompileAbandoned("every caller gave up before it started"))
                continue
            try:
                future.set_result(fn())
            except BaseException as exc:  # delivered to the callers, not raised here
                future.set_exception(exc)

    def close(self) -> None:
        """Stop the threads after the queued jobs (a running compile is not interrupted)."""
        if self._closed:
            return
        self._closed = True
        for _ in self._threads:
            self._jobs.put(None)


def _settle(target: Future[T], source: Future[T]) -> None:
    try:
        exc = source.exception()
        if exc is not None:
            target.set_exception(exc)
        else:
            target.set_result(source.result())
    except InvalidStateError:
        pass  # the deadline (or a cancel) settled it first


def with_deadline(
    inner: Future[T], timeout_s: float, on_timeout: Callable[[], BaseException]
) -> Future[T]:
    """A future that follows ``inner`` but fails with ``on_timeout()`` after ``timeout_s``."""
    outer: Future[T] = Future()
    if inner.done():
        _settle(outer, inner)
        return outer

    def expire() -> None:
        try:
            outer.set_exception(on_timeout())
        except InvalidStateError:
            pass

    timer = threading.Timer(timeout_s, expire)
    timer.daemon = True

    def finish(done: Future[T]) -> None:
        timer.cancel()
        _settle(outer, done)

    timer.start()
    inner.add_done_callback(finish)
    return outer
