"""Every error the engine raises for callers, and the codes that carry them between
processes.

Each message says what was wrong and what to do. Between the engine process and the API
servers an error travels as ``(code, message)`` (``to_wire`` / ``from_wire``): the code
names the class here, so nothing depends on class names or pickling exceptions. A code
the receiver does not know becomes a plain ``EngineError``.
"""

from __future__ import annotations


class EngineError(Exception):
    """Base class of errors meant for users."""

    code = "engine_error"


class StartupError(EngineError):
    """The engine cannot start with this configuration (names the flag to change)."""

    code = "startup_error"


class QueueFullError(EngineError):
    """The waiting queue is at its bound; the caller should retry later (HTTP 503)."""

    code = "queue_full"


class RequestValidationError(EngineError, ValueError):
    """A request is invalid (HTTP 400); the message names the field.

    ``param``: the field in the engine's words (``prompt``, ``max_tokens``, ...), which the
    HTTP layer reports as the error's ``param``; ``reason``: a finer code for callers that
    react to it (``context_length_exceeded``). Neither crosses the process pipe.
    """

    code = "invalid_request"

    def __init__(self, message: str, param: str | None = None, reason: str | None = None):
        super().__init__(message)
        self.param = param
        self.reason = reason


class EngineRequestError(EngineError):
    """The engine failed while running this request (HTTP 500); others may go on."""

    code = "request_failed"


class EngineDeadError(EngineError):
    """The engine loop stopped; restart the server."""

    code = "engine_dead"


class WorkerFailedError(EngineError):
    """A tensor-parallel worker raised or died; the engine cannot continue (restart it)."""

    code = "worker_failed"


_BY_CODE: dict[str, type[EngineError]] = {
    cls.code: cls
    for cls in (
        EngineError,
        StartupError,
        QueueFullError,
        RequestValidationError,
        EngineRequestError,
        EngineDeadError,
        WorkerFailedError,
    )
}


def to_wire(exc: BaseException) -> tuple[str, str]:
    """``(code, message)`` for ``exc``: its class's code, or ``internal_error`` with the
    exception's type in the message for anything that is not an ``EngineError``."""
    if isinstance(exc, EngineError):
        return exc.code, str(exc)
    if isinstance(exc, ValueError | TypeError):  # bad input or configuration, said plainly
        return RequestValidationError.code, str(exc)
    return "internal_error", f"{type(exc).__name__}: {exc}"


def from_wire(code: str, message: str) -> EngineError:
    """The exception a ``to_wire`` pair stands for (a plain ``EngineError`` if unknown)."""
    return _BY_CODE.get(code, EngineError)(message)
