"""Per-caller deadlines on a shared compile future.

Several callers may wait for one compile (same constraint); each gets its own future that
fails when its own deadline passes, while the compile itself is bounded (and killed) by
the worker pool (``compile_worker.py``)::

    caller ── compile_async ──> outer Future ◄── first of: inner done | timer fires
                                    ▲
    worker pool ─> inner Future (shared by callers of the same key)
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from concurrent.futures import Future, InvalidStateError
from typing import TypeVar

T = TypeVar("T")


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
