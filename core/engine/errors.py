"""Errors the engine raises for callers: each message says what was wrong and what to do."""

from __future__ import annotations


class EngineError(Exception):
    """Base class of errors meant for users."""


class StartupError(EngineError):
    """The engine cannot start with this configuration (names the flag to change)."""


class QueueFullError(EngineError):
    """The waiting queue is at its bound; the caller should retry later (HTTP 503)."""


class RequestValidationError(EngineError, ValueError):
    """A request is invalid (HTTP 400); the message names the field."""
