"""Issue 17 cases the JSON corpus cannot express: valid text next to the refused lone
surrogates, a repeated header, a huge ``model`` echoed short, one log line per request
for unknown fields, error messages free of library names. Against the real server."""

from __future__ import annotations

import json
import socket
import time
from pathlib import Path
from typing import Any

import httpx
import pytest
from engine.entrypoints.openai.body_text import find_lone_surrogate
from engine.entrypoints.openai.stats_logger import WarnOnce, ignored_fields_message
from sec_helpers import API_KEY, Server, raw_request

pytestmark = pytest.mark.timeout(300)


@pytest.mark.parametrize(
    ("body", "offset"),
    [
        (rb'"a\ud800b"', 2),
        (rb'"\ud83d\ude00"', None),  # a valid pair
        (rb'"\\ud800"', None),  # an escaped backslash, then plain text
        (rb'"\\\ud800"', 3),  # an escaped backslash, then the escape
        (rb'"\ude00\ud83d"', 1),  # low before high
        (rb'"\ud83d\ud83d\ude00"', 1),  # two highs: the first is lone
        (b'"a\xed\xa0\x80"', 2),  # a raw UTF-8 encoded surrogate
        ('"\U0001f600 ok"'.encode(), None),
    ],
)
def test_find_lone_surrogate(body: bytes, offset: int | None) -> None:
    assert find_lone_surrogate(body) == offset


def test_valid_text_passes_where_lone_surrogates_are_refused(sec_server: Server) -> None:
    for prompt in (r'"a\ud83d\ude00b"', r'"a\\ud800b"'):
        raw = f'{{"model": "tiny", "prompt": {prompt}, "max_tokens": 2}}'.encode()
        status, body = raw_request(
            sec_server.port, "POST", "/v1/completions",
            {**sec_server.headers, "Content-Type": "application/json"}, raw,
        )  # fmt: skip
        assert status == 200, body[:300]


def test_two_authorization_headers_are_refused(sec_server: Server) -> None:
    with socket.create_connection(("127.0.0.1", sec_server.port), timeout=10) as sock:
        sock.sendall(
            (
                "GET /v1/models HTTP/1.1\r\nHost: x\r\nConnection: close\r\n"
                f"Authorization: Bearer {API_KEY}\r\nAuthorization: Bearer {API_KEY}\r\n\r\n"
            ).encode()
        )
        data = b""
        while chunk := sock.recv(65536):
            data += chunk
    assert data.startswith(b"HTTP/1.1 401"), data[:300]
    assert b"Authorization header more than once" in data


def test_huge_model_name_is_not_echoed(sec_server: Server) -> None:
    name = "m" * 200_000
    r = httpx.post(
        sec_server.base_url + "/v1/completions",
        json={"model": name, "prompt": "hi"},
        headers=sec_server.headers,
    )
    assert r.status_code == 404, r.text[:300]
    assert len(r.content) < 1000, len(r.content)
    assert "(200000 characters)" in r.json()["error"]["message"]


def test_unknown_fields_log_one_line_per_request(sec_server: Server) -> None:
    before = sec_server.log().count("not supported by this server; ignored")
    for n in range(3):
        body = {"model": "tiny", "prompt": "hi", "max_tokens": 1}
        body.update({f"u{n}_{i}": i for i in range(15_000)})
        r = httpx.post(
            sec_server.base_url + "/v1/completions", json=body, headers=sec_server.headers
        )
        assert r.status_code == 200, r.text[:300]
    time.sleep(0.5)
    lines = [ln for ln in sec_server.log().splitlines() if "not supported by this server" in ln]
    assert len(lines) - before == 3, lines[-5:]
    assert all(len(line) < 1200 for line in lines), max(map(len, lines))
    assert "and 14992 more" in lines[-1]


def _rss_bytes(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) * 1024
    raise AssertionError("no VmRSS")


def test_hostile_bodies_do_not_grow_server_memory(sec_server: Server) -> None:
    """Unknown keys, overlong prompt text and refused schemas, 16 rounds: the API server's
    RSS grows by less than 24 MiB (measured: 4 MiB for 10 rounds; before, every unknown
    name stayed in the warn-once set: 240,000 strings here)."""
    assert sec_server.proc is not None
    url = sec_server.base_url + "/v1/completions"
    bodies: list[dict[str, Any]] = [
        {"model": "tiny", "prompt": "x" * 200_000},
        {"model": "tiny", "prompt": "hi", "structured_outputs": {"regex": "a{1000}{1000}"}},
    ]
    with httpx.Client(headers=sec_server.headers, timeout=60) as client:
        for body in bodies:  # warm up: first-use allocations are not growth
            client.post(url, json=body)
        before = _rss_bytes(sec_server.proc.pid)
        for n in range(16):
            unknown = {"model": "tiny", "prompt": "hi", "max_tokens": 1}
            unknown.update({f"r{n}_{i}": i for i in range(15_000)})
            assert client.post(url, json=unknown).status_code == 200
            for body in bodies:
                assert client.post(url, json=body).status_code == 400
        growth = _rss_bytes(sec_server.proc.pid) - before
    assert growth < 24 << 20, f"RSS grew {growth >> 20} MiB"


def test_warn_once_state_is_bounded() -> None:
    logged: list[str] = []

    class Log:
        def warning(self, message: str) -> None:
            logged.append(message)

    warn = WarnOnce(Log(), max_messages=10)  # type: ignore[arg-type]
    for i in range(1000):
        warn(ignored_fields_message([f"f{i}"], 1))
        warn(ignored_fields_message([f"f{i}"], 1))
    assert len(warn) == 10
    assert len(logged) == 10
    assert warn.num_dropped == 1980


def test_error_messages_name_no_internal_library(sec_server: Server) -> None:
    bodies = [
        {"model": "tiny", "prompt": "hi", "structured_outputs": {"grammar": 'root ::= "a"'}},
        {"model": "tiny", "prompt": "hi", "structured_outputs": {"regex": "(a"}},
    ]
    for body in bodies:
        r = httpx.post(
            sec_server.base_url + "/v1/completions", json=body, headers=sec_server.headers
        )
        assert r.status_code == 400, r.text[:300]
        message = json.loads(r.content)["error"]["message"].lower()
        for name in ("outlines", "codec", "jsonschema", "tokenizers", "pydantic"):
            assert name not in message, (name, message)
