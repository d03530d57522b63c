"""Liveness (``GET /health``) and readiness (``GET /ready``) of one server, for orchestrators.

    probe     200 when                                   503 when
    /health   the process serves and the engine loop     the engine died, or had work
              is alive (draining included)               pending and no progress for
                                                         --health-stall-timeout seconds
    /ready    /health would be 200, the model is         any /health failure, the engine
              loaded and the server is not draining      not ready yet, or SIGTERM received

A Kubernetes livenessProbe on ``/health`` restarts a wedged server; a readinessProbe on
``/ready`` takes a draining or broken replica out of the Service at once, while its
in-flight requests finish (``--shutdown-timeout``). Each 503 is an OpenAI-style error
object whose ``code`` names the reason (``engine_dead``, ``engine_stalled``,
``not_ready``, ``draining``).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from fastapi.responses import JSONResponse, Response

from engine.engine_client import EngineClient
from engine.entrypoints.openai.errors import error_body

# Routes that answer while the server drains (the rest get 503): orchestrators and
# routers must still see why this replica is going away, and scrape its last numbers.
PROBE_PATHS = frozenset({"/health", "/ready", "/metrics", "/load"})


@dataclass(frozen=True)
class ProbeFailure:
    code: str  # engine_dead, engine_stalled, not_ready, draining
    message: str

    def response(self) -> JSONResponse:
        return JSONResponse(error_body(self.message, 503, code=self.code), status_code=503)


def liveness_failure(engine_client: EngineClient, stall_limit_s: float) -> ProbeFailure | None:
    """Why the server should be restarted, or None while it is alive."""
    if engine_client.dead_error is not None:
        # No detail: the probes need no key, and the error text belongs to the log.
        return ProbeFailure("engine_dead", "The engine stopped (see the server log).")
    stalled_s = engine_client.stalled_for()
    if stall_limit_s > 0 and stalled_s > stall_limit_s:
        return ProbeFailure(
            "engine_stalled",
            f"The engine loop has made no progress for {stalled_s:.0f} s with requests "
            f"pending (--health-stall-timeout {stall_limit_s:g}).",
        )
    return None


def readiness_failure(
    engine_client: EngineClient, stall_limit_s: float, draining: bool
) -> ProbeFailure | None:
    """Why the server should get no new requests, or None when it should."""
    failure = liveness_failure(engine_client, stall_limit_s)
    if failure is not None:
        return failure
    if not engine_client.is_ready:
        return ProbeFailure("not_ready", "The engine is not ready (the model is still loading).")
    if draining:
        return ProbeFailure(
            "draining",
            "The server is shutting down: it finishes its in-flight requests "
            "(--shutdown-timeout) and takes no new ones.",
        )
    return None


def probe_response(failure: ProbeFailure | None, ready_body: dict[str, Any]) -> Response:
    if failure is not None:
        return failure.response()
    return JSONResponse(ready_body, status_code=200)


__all__ = [
    "PROBE_PATHS",
    "ProbeFailure",
    "liveness_failure",
    "probe_response",
    "readiness_failure",
]
