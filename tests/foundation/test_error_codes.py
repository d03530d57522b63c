"""Errors cross process boundaries as (code, message): every engine error class has its
own code and comes back as the same class; anything else is an internal error."""

from __future__ import annotations

import pytest
from engine import errors
from engine.plugins.errors import PluginError

CLASSES = [
    errors.EngineError,
    errors.StartupError,
    errors.QueueFullError,
    errors.RequestValidationError,
    errors.EngineRequestError,
    errors.EngineDeadError,
    errors.WorkerFailedError,
]


@pytest.mark.parametrize("cls", CLASSES)
def test_round_trip_keeps_class_and_message(cls: type[errors.EngineError]) -> None:
    code, message = errors.to_wire(cls("what went wrong; do this"))
    back = errors.from_wire(code, message)
    assert type(back) is cls and str(back) == "what went wrong; do this"


def test_codes_are_unique() -> None:
    codes = [cls.code for cls in CLASSES] + [PluginError.code]
    assert len(set(codes)) == len(codes)


def test_other_exceptions() -> None:
    assert errors.to_wire(ValueError("bad n")) == ("invalid_request", "bad n")
    code, message = errors.to_wire(KeyError("x"))
    assert code == "internal_error" and message.startswith("KeyError")
    unknown = errors.from_wire("some_future_code", "text")
    assert type(unknown) is errors.EngineError and str(unknown) == "text"
    # A plugin error reaches the other side as an engine error with its message.
    assert str(errors.from_wire(*errors.to_wire(PluginError("fix it")))) == "fix it"
