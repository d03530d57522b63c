"""``--ssl-keyfile`` / ``--ssl-certfile``: the real server over HTTPS with a self-signed
certificate (made here with the openssl CLI), driven by the openai client; a plain-HTTP
request is refused; a bad or half-given pair is a CLI error naming the flags."""

from __future__ import annotations

import shutil
import ssl
import subprocess
from pathlib import Path

import httpx
import openai
import pytest
from conftest import REAL_SERVER_FLAGS, ServerProcess, engine_cli, free_port


def _self_signed(folder: Path) -> tuple[Path, Path]:
    openssl = shutil.which("openssl")
    assert openssl, "the openssl CLI is needed to make a test certificate (apt install openssl)"
    key, cert = folder / "key.pem", folder / "cert.pem"
    subprocess.run(
        [
            openssl,
            "req",
            "-x509",
            "-newkey",
            "rsa:2048",
            "-nodes",
            "-days",
            "1",
            "-keyout",
            str(key),
            "-out",
            str(cert),
            "-subj",
            "/CN=127.0.0.1",
            "-addext",
            "subjectAltName=IP:127.0.0.1",
        ],  # fmt: skip
        check=True,
        capture_output=True,
    )
    return key, cert


def test_https_serving_with_openai_client(tiny_model: Path, tmp_path: Path) -> None:
    key, cert = _self_signed(tmp_path)
    port = free_port()
    cmd = [*engine_cli(), "serve", str(tiny_model), "--port", str(port), *REAL_SERVER_FLAGS]
    cmd += ["--ssl-keyfile", str(key), "--ssl-certfile", str(cert)]
    trust = ssl.create_default_context(cafile=str(cert))
    server = ServerProcess(cmd, port, scheme="https", verify=trust).start()
    try:
        client = openai.OpenAI(
            base_url=server.base_url + "/v1",
            api_key="unused",
            http_client=httpx.Client(verify=trust),
        )
        out = client.completions.create(
            model="tiny", prompt="hello", max_tokens=4, extra_body={"ignore_eos": True}
        )
        assert out.usage is not None and out.usage.completion_tokens == 4
        with pytest.raises(httpx.HTTPError):  # plain HTTP on the TLS port gets no response
            httpx.get(f"http://127.0.0.1:{port}/health", timeout=5)
        with pytest.raises(httpx.ConnectError):  # a client that does not trust the cert
            httpx.get(server.base_url + "/health", timeout=5)
    finally:
        server.stop()


def test_bad_tls_flags_are_cli_errors(tiny_model: Path, tmp_path: Path) -> None:
    key, cert = _self_signed(tmp_path)
    base = [*engine_cli(), "serve", str(tiny_model), "--device", "cpu"]
    cases = [
        (["--ssl-certfile", str(cert)], "--ssl-keyfile is missing"),
        (["--ssl-keyfile", str(key), "--ssl-certfile", str(tmp_path / "nope.pem")], "cannot be"),
        (["--ssl-keyfile", str(cert), "--ssl-certfile", str(cert)], "cannot be loaded"),
    ]
    for flags, needle in cases:
        r = subprocess.run([*base, *flags], capture_output=True, text=True, timeout=120)
        assert r.returncode == 2, r.stderr[-1500:]
        assert needle in r.stderr and "Traceback" not in r.stderr, r.stderr[-1500:]
