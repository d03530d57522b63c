"""OpenAI batch files, run offline: one JSON request per input line, one result per output line.

Each input line is ``{"custom_id", "method": "POST", "url", "body"}`` with ``url`` one of
``BATCH_URLS``. The request goes to the same FastAPI app ``engine serve`` runs (called in
process over ASGI, no socket), so validation, templates, parsers and errors are the
server's. Each output line is OpenAI's batch output record::

    {"id": "batch_req_...", "custom_id": ..., "error": null | {"code", "message"},
     "response": null | {"status_code", "request_id", "body"}}

A line that fails (malformed JSON, an unknown url, a 4xx from the route) is recorded with
its error and the run goes on. At most ``max_concurrency`` lines are in flight; each
result is written and flushed as soon as it is known (so lines come out in completion
order, matched by ``custom_id``), and a crash loses only the lines in flight.
"""

from __future__ import annotations

import asyncio
import json
import uuid
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import IO, Any

BATCH_URLS = (
    "/v1/chat/completions", "/v1/completions", "/v1/responses", "/v1/embeddings",
    "/v1/score", "/v1/rerank",
)  # fmt: skip


@dataclass
class BatchSummary:
    num_lines: int = 0
    num_succeeded: int = 0
    num_failed: int = 0


@dataclass
class AsgiResult:
    status: int
    body: bytes


async def asgi_post(app: Any, path: str, body: bytes, request_id: str) -> AsgiResult:
    """POST ``body`` to ``path`` of an ASGI ``app``; the status and the whole answer."""
    scope = {
        "type": "http", "asgi": {"version": "3.0"}, "http_version": "1.1", "method": "POST",
        "scheme": "http", "path": path, "raw_path": path.encode(), "query_string": b"",
        "root_path": "", "client": ("127.0.0.1", 0), "server": ("batch", 80),
        "headers": [
            (b"host", b"batch"), (b"content-type", b"application/json"),
            (b"content-length", str(len(body)).encode()), (b"x-request-id", request_id.encode()),
        ],
    }  # fmt: skip
    sent = False
    finished = asyncio.Event()
    status = 500
    chunks: list[bytes] = []

    async def receive() -> dict[str, Any]:
        nonlocal sent
        if not sent:
            sent = True
            return {"type": "http.request", "body": body, "more_body": False}
        await finished.wait()  # the client never leaves while the answer is pending
        return {"type": "http.disconnect"}

    async def send(message: dict[str, Any]) -> None:
        nonlocal status
        if message["type"] == "http.response.start":
            status = int(message["status"])
        elif message["type"] == "http.response.body":
            chunks.append(message.get("body", b""))
            if not message.get("more_body", False):
                finished.set()

    await app(scope, receive, send)
    finished.set()
    return AsgiResult(status, b"".join(chunks))


def _record(
    custom_id: Any, request_id: str, result: AsgiResult | None, error: dict[str, Any] | None
) -> dict[str, Any]:
    response = None
    if result is not None:
        try:
            body = json.loads(result.body) if result.body else None
        except json.JSONDecodeError:
            body = result.body.decode("utf-8", "replace")
        response = {"status_code": result.status, "request_id": request_id, "body": body}
        if result.status >= 400 and error is None:
            detail = body.get("error", {}) if isinstance(body, dict) else {}
            error = {
                "code": str(detail.get("code", result.status)),
                "message": str(detail.get("message", body)),
            }
    return {
        "id": f"batch_req_{uuid.uuid4().hex}",
        "custom_id": custom_id,
        "response": response,
        "error": error,
    }


def _bad_line(message: str) -> dict[str, Any]:
    return {"code": "invalid_batch_line", "message": message}


async def run_line(app: Any, line_no: int, line: str) -> dict[str, Any]:
    """One input line -> its output record (never raises for bad input)."""
    request_id = f"batch-{line_no}-{uuid.uuid4().hex[:8]}"
    try:
        item = json.loads(line)
    except json.JSONDecodeError as exc:
        return _record(None, request_id, None, _bad_line(f"line {line_no}: not JSON: {exc}"))
    if not isinstance(item, dict):
        return _record(None, request_id, None, _bad_line(f"line {line_no}: not a JSON object"))
    custom_id = item.get("custom_id")
    url, method, body = item.get("url"), item.get("method", "POST"), item.get("body")
    problem = None
    if url not in BATCH_URLS:
        problem = (
            f"line {line_no}: url {url!r} is not supported; use one of {', '.join(BATCH_URLS)}"
        )
    elif str(method).upper() != "POST":
        problem = f"line {line_no}: method {method!r} is not supported; batch requests are POST"
    elif not isinstance(body, dict):
        problem = f"line {line_no}: body must be a JSON object (the request of {url})"
    elif body.get("stream"):
        problem = f"line {line_no}: stream: true is not supported in a batch; drop it"
    if problem is not None:
        return _record(custom_id, request_id, None, _bad_line(problem))
    assert isinstance(url, str) and isinstance(body, dict)
    try:
        result = await asgi_post(app, url, json.dumps(body).encode(), request_id)
    except Exception as exc:  # the app answered 500 and re-raised: record it, go on
        message = f"line {line_no}: internal error ({type(exc).__name__}); see the log"
        return _record(custom_id, request_id, None, {"code": "internal_error", "message": message})
    return _record(custom_id, request_id, result, None)


async def run_batch(
    app: Any,
    lines: Iterable[str],
    out: IO[str],
    max_concurrency: int,
    on_done: Callable[[bool], None] | None = None,
) -> BatchSummary:
    """Run every non-blank line of ``lines`` with at most ``max_concurrency`` in flight,
    writing (and flushing) each record to ``out`` as it completes."""
    summary = BatchSummary()
    pending: set[asyncio.Task[dict[str, Any]]] = set()

    def write(record: dict[str, Any]) -> None:
        out.write(json.dumps(record, ensure_ascii=False) + "\n")
        out.flush()
        ok = record["error"] is None
        summary.num_succeeded += ok
        summary.num_failed += not ok
        if on_done is not None:
            on_done(ok)

    async def drain(until: int) -> None:
        while len(pending) > until:
            done, _ = await asyncio.wait(pending, return_when=asyncio.FIRST_COMPLETED)
            for task in done:
                pending.discard(task)
                write(task.result())

    for line_no, line in enumerate(lines, start=1):
        if not line.strip():
            continue
        summary.num_lines += 1
        pending.add(asyncio.ensure_future(run_line(app, line_no, line)))
        await drain(max_concurrency - 1)
    await drain(0)
    return summary
