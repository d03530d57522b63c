"""OpenAI error objects (never 422, never 500 for bad input) and API-key rules per route."""

from __future__ import annotations

import httpx
import openai
import pytest
from conftest import API_KEY, ServerProcess

pytestmark = pytest.mark.timeout(120)
MESSAGES = [{"role": "user", "content": "Hello"}]


def post(server: ServerProcess, path: str, body: object, **kw: object) -> httpx.Response:
    headers = kw.pop("headers", server.headers)
    if isinstance(body, (bytes, str)):
        return httpx.post(
            server.base_url + path,
            content=body,
            headers={**headers, "Content-Type": "application/json"},  # type: ignore[dict-item]
        )
    return httpx.post(server.base_url + path, json=body, headers=headers)  # type: ignore[arg-type]


def assert_error(r: httpx.Response, status: int, *needles: str) -> dict[str, object]:
    assert r.status_code == status, r.text
    err = r.json()["error"]
    assert set(err) >= {"message", "type", "param", "code"}
    for needle in needles:
        assert needle in err["message"], err["message"]
    return err


def test_unknown_model_404(server: ServerProcess) -> None:
    r = post(server, "/v1/chat/completions", {"model": "gpt-4", "messages": MESSAGES})
    err = assert_error(r, 404, "The model `gpt-4` does not exist.")
    assert err["param"] == "model"
    client = openai.OpenAI(base_url=server.base_url + "/v1", api_key=API_KEY, max_retries=0)
    with pytest.raises(openai.NotFoundError):
        client.completions.create(model="gpt-4", prompt="hi")


def test_context_overflow_400_names_numbers(server: ServerProcess) -> None:
    max_len = httpx.get(server.base_url + "/v1/models", headers=server.headers).json()["data"][0][
        "max_model_len"
    ]
    prompt = "Hello world! " * 10
    n_prompt = post(server, "/tokenize", {"prompt": prompt}).json()["count"]
    r = post(server, "/v1/completions", {"model": "tiny", "prompt": prompt, "max_tokens": max_len})
    err = assert_error(r, 400, str(max_len), str(n_prompt), str(n_prompt + max_len))
    assert err["code"] == "context_length_exceeded"
    long_prompt = "Hello world! " * (max_len)
    r = post(server, "/v1/completions", {"model": "tiny", "prompt": long_prompt})
    assert_error(r, 400, str(max_len))


def test_malformed_json_400(server: ServerProcess) -> None:
    r = post(server, "/v1/chat/completions", b'{"model": "tiny", "messages": [')
    assert_error(r, 400, "Malformed JSON")


@pytest.mark.parametrize(
    "body,field",
    [
        ({"model": "tiny", "messages": MESSAGES, "temperature": "hot"}, "temperature"),
        ({"model": "tiny", "messages": MESSAGES, "max_tokens": "many"}, "max_tokens"),
        ({"model": "tiny", "messages": "hello"}, "messages"),
        ({"model": "tiny"}, "messages"),
        ({"model": "tiny", "messages": MESSAGES, "n": [1]}, "n"),
        ({"model": "tiny", "messages": MESSAGES, "stream": "yes please"}, "stream"),
    ],
)
def test_wrong_types_400_name_field(
    server: ServerProcess, body: dict[str, object], field: str
) -> None:
    r = post(server, "/v1/chat/completions", body)
    err = assert_error(r, 400, field)
    assert err["param"] is not None and field in str(err["param"])


@pytest.mark.parametrize(
    "extra,field",
    [
        ({"temperature": -1}, "temperature"),
        ({"top_p": 0}, "top_p"),
        ({"n": 0}, "n"),
        ({"max_tokens": 0}, "max_tokens"),
        ({"logprobs": 99}, "logprobs"),
        ({"stop": [""]}, "stop"),
        ({"prompt": [10**9]}, "prompt"),
        ({"prompt": []}, "prompt"),
    ],
)
def test_out_of_range_400(server: ServerProcess, extra: dict[str, object], field: str) -> None:
    body = {"model": "tiny", "prompt": "Hi", "max_tokens": 4, **extra}
    r = post(server, "/v1/completions", body)
    assert_error(r, 400, field)


def test_top_logprobs_without_logprobs(server: ServerProcess) -> None:
    body = {"model": "tiny", "messages": MESSAGES, "top_logprobs": 2}
    assert_error(post(server, "/v1/chat/completions", body), 400, "logprobs")


def test_unknown_route_is_json_404(server: ServerProcess) -> None:
    r = httpx.get(server.base_url + "/v1/nothing", headers=server.headers)
    assert_error(r, 404)


PROTECTED = [
    ("GET", "/v1/models", None),
    ("GET", "/version", None),
    ("GET", "/load", None),
    ("GET", "/metrics", None),
    ("POST", "/v1/chat/completions", {"model": "tiny", "messages": MESSAGES, "max_tokens": 1}),
    ("POST", "/v1/completions", {"model": "tiny", "prompt": "Hi", "max_tokens": 1}),
    ("POST", "/tokenize", {"prompt": "Hi"}),
    ("POST", "/detokenize", {"tokens": [5]}),
]


@pytest.mark.parametrize("method,path,body", PROTECTED)
def test_key_required_on_every_route(
    server: ServerProcess, method: str, path: str, body: object
) -> None:
    url = server.base_url + path
    for headers in ({}, {"Authorization": "Bearer wrong"}, {"Authorization": API_KEY}):
        r = httpx.request(method, url, json=body, headers=headers)
        assert_error(r, 401)
        assert r.headers.get("www-authenticate") == "Bearer"
    ok = httpx.request(method, url, json=body, headers=server.headers)
    assert ok.status_code == 200, ok.text


def test_health_needs_no_key(server: ServerProcess) -> None:
    assert httpx.get(server.base_url + "/health").status_code == 200


@pytest.mark.parametrize("path", ["//v1/models", "/v1/../metrics", "/V1/models", "/v1/models/"])
def test_odd_paths_do_not_bypass_auth(server: ServerProcess, path: str) -> None:
    r = httpx.get(server.base_url + path)
    assert r.status_code in (401, 404), (path, r.status_code)
    assert r.status_code != 200


def test_openai_client_wrong_key(server: ServerProcess) -> None:
    client = openai.OpenAI(base_url=server.base_url + "/v1", api_key="nope", max_retries=0)
    with pytest.raises(openai.AuthenticationError):
        client.models.list()


def test_no_key_server_and_metrics_without_auth(make_fake_server) -> None:  # type: ignore[no-untyped-def]
    open_server = make_fake_server()
    assert httpx.get(open_server.base_url + "/v1/models").status_code == 200
    keyed = make_fake_server("--metrics-without-auth", api_key="k2")
    assert httpx.get(keyed.base_url + "/metrics").status_code == 200
    assert httpx.get(keyed.base_url + "/v1/models").status_code == 401
    assert "--api-key on the command line" not in keyed.log()  # given through --config
