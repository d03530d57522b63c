"""OpenAI-style error bodies and the exception handlers that produce them.

Every error leaves the server as ``{"error": {"message", "type", "param", "code"}}`` with a
4xx/5xx status. Bad input is always a 400 that names the field (FastAPI's 422 never
appears); only a bug inside the server is a 500.
"""

from __future__ import annotations

import logging
from http import HTTPStatus
from typing import Any

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from pydantic import ValidationError
from starlette.exceptions import HTTPException as StarletteHTTPException

from engine.errors import QueueFullError
from engine.errors import RequestValidationError as EngineRequestValidationError

logger = logging.getLogger("engine.server")

_ERROR_TYPES = {
    400: "invalid_request_error",
    401: "authentication_error",
    403: "permission_error",
    404: "not_found_error",
    405: "invalid_request_error",
    409: "conflict_error",
    413: "invalid_request_error",
    431: "invalid_request_error",
    429: "rate_limit_error",
    500: "internal_server_error",
    503: "service_unavailable",
}


class APIError(Exception):
    """An error to return to the client as an OpenAI error object."""

    def __init__(
        self,
        message: str,
        status: int = 400,
        param: str | None = None,
        code: str | None = None,
        headers: dict[str, str] | None = None,
    ) -> None:
        super().__init__(message)
        self.message = message
        self.status = status
        self.param = param
        self.code = code
        self.headers = headers


def error_body(
    message: str, status: int = 400, param: str | None = None, code: str | None = None
) -> dict[str, Any]:
    return {
        "error": {
            "message": message,
            "type": _ERROR_TYPES.get(status, "invalid_request_error"),
            "param": param,
            "code": code if code is not None else status,
        }
    }


def error_response(exc: APIError) -> JSONResponse:
    return JSONResponse(
        error_body(exc.message, exc.status, exc.param, exc.code),
        status_code=exc.status,
        headers=exc.headers,
    )


MAX_ECHOED_CHARS = 64


def shorten(value: str, limit: int = MAX_ECHOED_CHARS) -> str:
    """``value`` cut to ``limit`` characters for an error message (a client's 1 MB field
    is not echoed back in full)."""
    return value if len(value) <= limit else f"{value[:limit]}... ({len(value)} characters)"


def model_not_found(name: str, served: list[str] | None = None) -> APIError:
    listing = f" Served models: {', '.join(served)}." if served else ""
    return APIError(
        f"The model `{shorten(name)}` does not exist.{listing}",
        404,
        "model",
        "model_not_found",
    )


def queue_full(exc: Exception | str) -> APIError:
    return APIError(
        f"The server is at capacity: {exc}. Retry later.",
        503,
        code="queue_full",
        headers={"Retry-After": "1"},
    )


def invalid_request(exc: ValueError, prompt_field: str = "prompt") -> APIError:
    """The 400 for the engine's ``RequestValidationError``: its ``param`` and ``reason``
    as the error's ``param`` and ``code``, the prompt named as the route names it
    (``prompt_field``). A prompt that leaves no room for output has always been reported
    under ``messages``, on every route."""
    param: str | None = getattr(exc, "param", None)
    reason: str | None = getattr(exc, "reason", None)
    if param == "prompt":
        param = "messages" if reason == "context_length_exceeded" else prompt_field
    return APIError(str(exc), 400, param, reason)


def internal_error(request_id: str | None) -> APIError:
    """The 500 a client sees: no exception text (it may hold paths, user names, addresses);
    the full detail goes to the server log under the same request id."""
    return APIError(
        f"Internal server error while serving request {request_id or 'unknown'}; the "
        "server log has the details under this request id.",
        500,
        code="internal_error",
    )


def internal_error_body(request_id: str | None) -> dict[str, Any]:
    exc = internal_error(request_id)
    return error_body(exc.message, 500, code=exc.code)


def stream_error_body(exc: BaseException, request_id: str | None) -> dict[str, Any]:
    """The error chunk for a stream that failed after its headers went out."""
    if isinstance(exc, APIError):
        return error_body(exc.message, exc.status, exc.param, exc.code)
    return internal_error_body(request_id)


def describe_validation_errors(errors: list[Any]) -> tuple[str, str | None]:
    """One readable message from pydantic errors, and the first offending field."""
    parts = []
    first_param: str | None = None
    for err in errors:
        raw_loc = [p for p in err.get("loc", ()) if p != "body"]
        if err.get("type") == "json_invalid":
            ctx = err.get("ctx", {}) or {}
            detail = ctx.get("error", err.get("msg", ""))
            return f"Malformed JSON body: {detail}. Send a valid JSON object.", None
        # A union reports one entry per member type; the field name is enough.
        field = _field_path([p for p in raw_loc if not _looks_like_type_tag(str(p))])
        if first_param is None:
            first_param = field
        if field == "body":
            parts.append(
                "the request body must be a JSON object (send Content-Type: application/json)"
            )
            continue
        parts.append(f"{field}: {err.get('msg', 'invalid value')}")
    unique = list(dict.fromkeys(parts))
    return "Invalid request: " + "; ".join(unique[:5]), first_param


def _field_path(loc: list[Any]) -> str:
    """``["messages", 0, "role"]`` -> ``messages[0].role``."""
    out = ""
    for part in loc:
        out += f"[{part}]" if isinstance(part, int) else (f".{part}" if out else str(part))
    return out or "body"


def _looks_like_type_tag(part: str) -> bool:
    return part in ("str", "int", "float", "bool", "list[str]", "list[int]", "list[list[int]]") or (
        part.startswith(("list[", "dict[", "function-", "literal["))
    )


def install_error_handlers(app: FastAPI) -> None:
    @app.exception_handler(APIError)
    async def _api_error(request: Request, exc: APIError) -> JSONResponse:
        return error_response(exc)

    @app.exception_handler(RequestValidationError)
    async def _validation(request: Request, exc: RequestValidationError) -> JSONResponse:
        message, param = describe_validation_errors(list(exc.errors()))
        return error_response(APIError(message, 400, param))

    @app.exception_handler(ValidationError)
    async def _pydantic(request: Request, exc: ValidationError) -> JSONResponse:
        message, param = describe_validation_errors(list(exc.errors()))
        return error_response(APIError(message, 400, param))

    @app.exception_handler(EngineRequestValidationError)
    async def _engine_validation(
        request: Request, exc: EngineRequestValidationError
    ) -> JSONResponse:
        return error_response(invalid_request(exc))

    @app.exception_handler(QueueFullError)
    async def _queue_full(request: Request, exc: Exception) -> JSONResponse:
        return error_response(queue_full(exc))

    @app.exception_handler(StarletteHTTPException)
    async def _http(request: Request, exc: StarletteHTTPException) -> JSONResponse:
        try:
            phrase = HTTPStatus(exc.status_code).phrase
        except ValueError:
            phrase = "Error"
        message = exc.detail if isinstance(exc.detail, str) else phrase
        if exc.status_code == 404 and message == "Not Found":
            message = f"No route {request.method} {request.url.path}. See /docs or /v1/models."
        return error_response(APIError(message, exc.status_code))

    @app.exception_handler(Exception)
    async def _internal(request: Request, exc: Exception) -> JSONResponse:
        request_id = getattr(request.state, "request_id", None)
        logger.error(
            "internal error while serving %s (request %s)",
            request.url.path,
            request_id,
            exc_info=exc,
        )
        return error_response(internal_error(request_id))
