"""The OpenAPI document at ``/openapi.json``: every status a route can answer, documented.

FastAPI documents 422 for body validation, which this server never sends (bad input is a
400 naming the field); this replaces it with the error statuses the server does send, each
with the OpenAI error object, so a schema-driven fuzzer or client generator sees the truth.
"""

from __future__ import annotations

from typing import Any

from fastapi import FastAPI
from fastapi.openapi.utils import get_openapi
from pydantic import BaseModel


class ErrorDetail(BaseModel):
    message: str
    type: str
    param: str | None = None
    code: int | str | None = None


class ErrorResponse(BaseModel):
    error: ErrorDetail


ERROR_STATUSES = {
    "400": "Invalid request (the message names the field and the bound).",
    "401": "Missing or wrong API key.",
    "404": "Unknown model or route.",
    "409": "A request with this X-Request-Id is already running.",
    "413": "Request body over --max-request-body-bytes.",
    "429": "Rate limited.",
    "431": "Request headers over --max-header-bytes.",
    "500": "Internal error (generic message and the request id; details in the server log).",
    "503": "Queue full, engine not running, or shutting down (see Retry-After).",
}
_HEALTH_STATUSES = {"200", "503"}


def install_openapi(app: FastAPI) -> None:
    """Replace ``app.openapi`` with one that documents the error statuses."""

    def openapi() -> dict[str, Any]:
        if app.openapi_schema:
            return app.openapi_schema
        schema = get_openapi(
            title=app.title, version=app.version, routes=app.routes, description=app.description
        )
        components = schema.setdefault("components", {}).setdefault("schemas", {})
        components["ErrorResponse"] = ErrorResponse.model_json_schema(
            ref_template="#/components/schemas/{model}"
        )
        components.update(components["ErrorResponse"].pop("$defs", {}))
        ref = {"$ref": "#/components/schemas/ErrorResponse"}
        for path, item in schema.get("paths", {}).items():
            for operation in item.values():
                responses = operation.setdefault("responses", {})
                responses.pop("422", None)
                for status, description in ERROR_STATUSES.items():
                    if path == "/health" and status not in _HEALTH_STATUSES:
                        continue
                    responses[status] = {
                        "description": description,
                        "content": {"application/json": {"schema": ref}},
                    }
        for name in ("HTTPValidationError", "ValidationError"):
            components.pop(name, None)
        app.openapi_schema = schema
        return schema

    app.openapi = openapi  # type: ignore[method-assign]
