"""Request-size limits: headers over ``--max-header-bytes`` are refused with 431, a body over
``--max-request-body-bytes`` with 413 before it is read into memory.

uvicorn's h11 parser bounds what it buffers of an incomplete request head (``server.py``
sets that to the header limit too), but a head that arrives whole in one read is passed
on whatever its size, hence the second check here.

A declared ``Content-Length`` over the limit is refused at once, unread. A body without one
(chunked) is read up to the limit and refused as soon as it passes it. An accepted body is
replayed to the app; later ``receive()`` calls go to the client again, so a disconnect still
reaches a streaming response.

Two more refusals need the whole head or body and so live here too: a request that sends
both ``Transfer-Encoding`` and ``Content-Length`` (or two lengths) is a 400 with the
connection closed, since a proxy in front may frame it differently (request smuggling); a
body holding a lone UTF-16 surrogate is a 400 (``body_text``).
"""

from __future__ import annotations

from typing import Any

from fastapi.responses import JSONResponse

from engine.entrypoints.openai.body_text import find_lone_surrogate, lone_surrogate_message
from engine.entrypoints.openai.errors import error_body

_BODY_METHODS = frozenset({"POST", "PUT", "PATCH"})


def _too_large(limit: int) -> JSONResponse:
    body = error_body(
        f"The request body is larger than the server's limit of {limit} bytes "
        "(--max-request-body-bytes); send a smaller request.",
        413,
        code="request_too_large",
    )
    return JSONResponse(body, status_code=413, headers={"Connection": "close"})


def _headers_too_large(limit: int) -> JSONResponse:
    body = error_body(
        f"The request headers are larger than the server's limit of {limit} bytes "
        "(--max-header-bytes); send fewer or shorter headers.",
        431,
        code="headers_too_large",
    )
    return JSONResponse(body, status_code=431, headers={"Connection": "close"})


def _bad_request(message: str, close: bool = False) -> JSONResponse:
    headers = {"Connection": "close"} if close else None
    return JSONResponse(error_body(message, 400), status_code=400, headers=headers)


def _framing_error(headers: list[tuple[bytes, bytes]]) -> str | None:
    """Why the head's body framing is ambiguous, or None."""
    names = [k.lower() for k, _ in headers]
    num_lengths = names.count(b"content-length")
    if b"transfer-encoding" in names and num_lengths:
        return (
            "The request sends both Transfer-Encoding and Content-Length; send only one "
            "(a proxy could frame the body differently)."
        )
    if num_lengths > 1:
        return "The request sends Content-Length more than once; send it once."
    return None


class RequestSizeLimitMiddleware:
    """Pure ASGI middleware: 431 for heads over ``max_header_bytes``, 413 for bodies over
    ``max_bytes``."""

    def __init__(self, app: Any, max_bytes: int, max_header_bytes: int) -> None:
        self.app = app
        self.max_bytes = max_bytes
        self.max_header_bytes = max_header_bytes

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        head_size = len(scope.get("raw_path") or b"") + len(scope.get("query_string") or b"")
        head_size += sum(len(k) + len(v) + 4 for k, v in scope.get("headers") or [])
        if head_size > self.max_header_bytes:
            await _headers_too_large(self.max_header_bytes)(scope, receive, send)
            return
        if scope.get("method") not in _BODY_METHODS:
            await self.app(scope, receive, send)
            return
        framing_error = _framing_error(list(scope.get("headers") or []))
        if framing_error:
            await _bad_request(framing_error, close=True)(scope, receive, send)
            return
        declared = dict(scope.get("headers") or []).get(b"content-length")
        if declared is not None:
            try:
                size = int(declared)
            except ValueError:
                size = -1
            if size < 0:
                body = error_body("Content-Length must be a non-negative integer.", 400)
                await JSONResponse(body, status_code=400)(scope, receive, send)
                return
            if size > self.max_bytes:
                await _too_large(self.max_bytes)(scope, receive, send)
                return
        chunks: list[bytes] = []
        num_bytes = 0
        while True:
            message = await receive()
            if message["type"] != "http.request":  # the client left while sending
                await self.app(scope, _replay([message], receive), send)
                return
            chunk = message.get("body", b"")
            num_bytes += len(chunk)
            if num_bytes > self.max_bytes:
                await _too_large(self.max_bytes)(scope, receive, send)
                return
            chunks.append(chunk)
            if not message.get("more_body", False):
                break
        body = b"".join(chunks)
        surrogate_at = find_lone_surrogate(body)
        if surrogate_at is not None:
            await _bad_request(lone_surrogate_message(body, surrogate_at))(scope, receive, send)
            return
        whole = {"type": "http.request", "body": body, "more_body": False}
        await self.app(scope, _replay([whole], receive), send)


def _replay(messages: list[dict[str, Any]], receive: Any) -> Any:
    pending = list(messages)

    async def replay() -> Any:
        if pending:
            return pending.pop(0)
        return await receive()

    return replay
