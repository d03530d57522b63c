"""Request-size limit: a body over ``--max-request-body-bytes`` is refused with 413 before it
is read into memory (header sizes are bounded by uvicorn's h11 parser, see ``server.py``).

A declared ``Content-Length`` over the limit is refused at once, unread. A body without one
(chunked) is read up to the limit and refused as soon as it passes it. An accepted body is
replayed to the app; later ``receive()`` calls go to the client again, so a disconnect still
reaches a streaming response.
"""

from __future__ import annotations

from typing import Any

from fastapi.responses import JSONResponse

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


class BodySizeLimitMiddleware:
    """Pure ASGI middleware: 413 for bodies over ``max_bytes``."""

    def __init__(self, app: Any, max_bytes: int) -> None:
        self.app = app
        self.max_bytes = max_bytes

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        if scope["type"] != "http" or scope.get("method") not in _BODY_METHODS:
            await self.app(scope, receive, send)
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
        whole = {"type": "http.request", "body": b"".join(chunks), "more_body": False}
        await self.app(scope, _replay([whole], receive), send)


def _replay(messages: list[dict[str, Any]], receive: Any) -> Any:
    pending = list(messages)

    async def replay() -> Any:
        if pending:
            return pending.pop(0)
        return await receive()

    return replay
