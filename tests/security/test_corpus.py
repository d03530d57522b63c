"""Regression corpus of hostile requests (``corpus/*.json``, one file per class) against the
real server: each case gets its documented status, an OpenAI error object whose message
holds the expected text (and names the field), and a good request succeeds afterwards.

Case keys: ``method`` (default POST), ``path`` (sent byte for byte), ``headers``, ``auth``
(default true: send the key), a body as ``json`` / ``raw`` (text) / ``raw_hex`` /
``raw_nested`` (that many ``[``) / ``raw_size`` (a JSON body of that many bytes) /
``chunked_size`` (the same, chunked), ``many_headers``; ``status`` (an int or a list),
``message`` (a substring, or null: not checked) and ``param``. JSON values may use the
macros ``{"$repeat": X, "times": N}`` (a list), ``{"$repeat_str": S, "times": N}`` (a string)
``{"$keys": N}`` (an object of N keys) and ``{"$schema_nest": N}`` (a JSON schema of N
nested objects).
"""

from __future__ import annotations

import json
import socket
from pathlib import Path
from typing import Any

import pytest
from sec_helpers import API_KEY, Server, good_request, raw_request

pytestmark = pytest.mark.timeout(300)
CORPUS = Path(__file__).parent / "corpus"


def expand(value: Any) -> Any:
    if isinstance(value, dict):
        if "$repeat" in value:
            return [expand(value["$repeat"])] * value["times"]
        if "$repeat_str" in value:
            return value["$repeat_str"] * value["times"]
        if "$keys" in value:
            return {f"k{i}": i for i in range(value["$keys"])}
        if "$schema_nest" in value:
            schema: dict[str, Any] = {"type": "string"}
            for _ in range(value["$schema_nest"]):
                schema = {"type": "object", "properties": {"a": schema}, "required": ["a"]}
            return schema
        return {k: expand(v) for k, v in value.items()}
    if isinstance(value, list):
        return [expand(v) for v in value]
    return value


def load_cases() -> list[Any]:
    params = []
    for file in sorted(CORPUS.glob("*.json")):
        data = json.loads(file.read_text())
        assert data["cases"], file
        for case in data["cases"]:
            params.append(pytest.param(case, id=f"{file.stem}: {case['name']}"))
    return params


def body_of(case: dict[str, Any]) -> bytes:
    if "json" in case:
        return json.dumps(expand(case["json"])).encode()
    if "raw" in case:
        return str(case["raw"]).encode()
    if "raw_hex" in case:
        return bytes.fromhex(case["raw_hex"])
    if "raw_nested" in case:
        return b"[" * case["raw_nested"]
    if "raw_size" in case:
        prompt = "a" * case["raw_size"]
        return json.dumps({"model": "tiny", "prompt": prompt}).encode()
    return b""


def send_chunked(port: int, path: str, headers: dict[str, str], size: int) -> tuple[int, bytes]:
    """A chunked body of ``size`` bytes (no Content-Length): the limit applies while reading."""
    head = [f"POST {path} HTTP/1.1", f"Host: 127.0.0.1:{port}", "Connection: close"]
    head += [f"{k}: {v}" for k, v in headers.items()]
    head += ["Content-Type: application/json", "Transfer-Encoding: chunked"]
    with socket.create_connection(("127.0.0.1", port), timeout=10) as sock:
        sock.sendall(("\r\n".join(head) + "\r\n\r\n").encode())
        piece = b"a" * 16384
        try:
            for _ in range(size // len(piece) + 1):
                sock.sendall(b"%x\r\n%s\r\n" % (len(piece), piece))
            sock.sendall(b"0\r\n\r\n")
        except OSError:
            pass  # refused early: the server closed the connection
        data = b""
        try:
            while chunk := sock.recv(65536):
                data += chunk
        except (ConnectionResetError, TimeoutError):
            pass
    head_bytes, _, rest = data.partition(b"\r\n\r\n")
    status = int(head_bytes.split(b" ", 2)[1]) if data.startswith(b"HTTP/1.") else 0
    return status, rest


def send(server: Server, case: dict[str, Any]) -> tuple[int, bytes]:
    headers = {k: expand(v) for k, v in (case.get("headers") or {}).items()}
    if case.get("auth", True):
        headers.setdefault("Authorization", f"Bearer {API_KEY}")
    body = body_of(case)
    if body and not any(k.lower() == "content-type" for k in headers):
        headers["Content-Type"] = "application/json"
    for i in range(case.get("many_headers", 0)):
        headers[f"X-H{i}"] = "v" * 16
    if "chunked_size" in case:
        return send_chunked(server.port, case["path"], headers, case["chunked_size"])
    method = case.get("method", "POST")
    if "Content-Length" in headers:  # a hand-written (bad) length replaces the real one
        return _raw_with_length(server.port, method, case["path"], headers, body)
    return raw_request(server.port, method, case["path"], headers, body, timeout=30)


def _raw_with_length(
    port: int, method: str, path: str, headers: dict[str, str], body: bytes
) -> tuple[int, bytes]:
    lines = [f"{method} {path} HTTP/1.1", f"Host: 127.0.0.1:{port}", "Connection: close"]
    lines += [f"{k}: {v}" for k, v in headers.items()]
    with socket.create_connection(("127.0.0.1", port), timeout=10) as sock:
        sock.sendall(("\r\n".join(lines) + "\r\n\r\n").encode() + body)
        data = b""
        try:
            while chunk := sock.recv(65536):
                data += chunk
        except (ConnectionResetError, TimeoutError):
            pass
    head, _, rest = data.partition(b"\r\n\r\n")
    return (int(head.split(b" ", 2)[1]) if data.startswith(b"HTTP/1.") else 0), rest


@pytest.mark.parametrize("case", load_cases())
def test_hostile_request(sec_server: Server, case: dict[str, Any]) -> None:
    status, body = send(sec_server, case)
    allowed = case["status"] if isinstance(case["status"], list) else [case["status"]]
    assert status in allowed, (status, body[:500])
    assert status != 200 and status < 500, (status, body[:500])
    if case.get("message") is not None:
        error = json.loads(body)["error"]
        assert set(error) == {"message", "type", "param", "code"}, error
        assert case["message"] in error["message"], error
        if case.get("param") is not None:
            assert error["param"] == case["param"], error
    elif body.startswith(b"{"):  # the HTTP parser's own refusals are plain text
        assert set(json.loads(body)["error"]) == {"message", "type", "param", "code"}
    for leak in ("Traceback", 'File "', "/work/", "/home/", "site-packages"):
        assert leak.encode() not in body, (leak, body[:500])
    good_request(sec_server)
