"""Every engine-core test runs twice: synchronous steps, then async scheduling (one step
in flight while the next is scheduled), through ``make_core``'s default."""

from __future__ import annotations

from collections.abc import Iterator

import core_fakes
import pytest


@pytest.fixture(autouse=True, params=[False, True], ids=["sync", "async"])
def async_scheduling(request: pytest.FixtureRequest) -> Iterator[bool]:
    core_fakes.ASYNC_SCHEDULING[0] = request.param
    yield request.param
    core_fakes.ASYNC_SCHEDULING[0] = False
