"""API-key check, attached as a dependency to every route except ``/health``.

The check runs on the resolved route (not a prefix match of the raw path, which ``//v1``
or ``/v1/../metrics`` style paths could dodge) and compares in constant time.
"""

from __future__ import annotations

import hmac
from collections.abc import Awaitable, Callable

from fastapi import Request

from engine.entrypoints.openai.errors import APIError


def make_api_key_dependency(api_key: str | None) -> Callable[[Request], Awaitable[None]]:
    """A FastAPI dependency that raises 401 unless ``Authorization: Bearer KEY`` matches."""
    expected = api_key.encode() if api_key else None

    async def require_api_key(request: Request) -> None:
        if expected is None:
            return
        given = request.headers.getlist("authorization")
        if len(given) > 1:
            raise APIError(
                "The request sends the Authorization header more than once; send it once.",
                401,
                code="invalid_api_key",
                headers={"WWW-Authenticate": "Bearer"},
            )
        header = given[0] if given else ""
        scheme, _, token = header.partition(" ")
        if scheme.lower() != "bearer" or not token:
            raise APIError(
                "Missing API key: send the header 'Authorization: Bearer YOUR_KEY' "
                "(the key the server was started with via --api-key or ENGINE_API_KEY).",
                401,
                code="invalid_api_key",
                headers={"WWW-Authenticate": "Bearer"},
            )
        if not hmac.compare_digest(token.strip().encode(), expected):
            raise APIError(
                "Incorrect API key provided.",
                401,
                code="invalid_api_key",
                headers={"WWW-Authenticate": "Bearer"},
            )

    return require_api_key
