"""The OpenAI API through the official ``openai`` client against ``engine serve``."""

from __future__ import annotations

import json

import httpx
import openai
import pytest
from conftest import API_KEY, ServerProcess

pytestmark = pytest.mark.timeout(120)
MESSAGES = [{"role": "user", "content": "Hello world! How are you today?"}]


@pytest.fixture(scope="module")
def client(server: ServerProcess) -> openai.OpenAI:
    return openai.OpenAI(base_url=server.base_url + "/v1", api_key=API_KEY, max_retries=0)


def test_models_lists_served_names(client: openai.OpenAI) -> None:
    ids = [m.id for m in client.models.list().data]
    assert ids == ["tiny", "tiny-alias"]


def test_chat_completion(client: openai.OpenAI) -> None:
    resp = client.chat.completions.create(
        model="tiny",
        messages=MESSAGES,
        max_tokens=8,
        temperature=0,
        extra_body={"ignore_eos": True},
    )
    assert resp.id.startswith("chatcmpl-")
    assert resp.object == "chat.completion"
    assert resp.model == "tiny"
    choice = resp.choices[0]
    assert choice.index == 0 and choice.message.role == "assistant"
    assert choice.finish_reason == "length"
    assert isinstance(choice.message.content, str) and choice.message.content
    assert resp.usage.completion_tokens == 8
    assert resp.usage.prompt_tokens > 5
    assert resp.usage.total_tokens == resp.usage.prompt_tokens + 8


def test_alias_and_max_completion_tokens(client: openai.OpenAI) -> None:
    resp = client.chat.completions.create(
        model="tiny-alias",
        messages=MESSAGES,
        max_completion_tokens=3,
        extra_body={"ignore_eos": True},
    )
    assert resp.model == "tiny-alias"
    assert resp.usage.completion_tokens == 3


def test_completion_text_and_usage(client: openai.OpenAI) -> None:
    resp = client.completions.create(
        model="tiny", prompt="The quick brown fox", max_tokens=5, temperature=0,
        extra_body={"ignore_eos": True},
    )  # fmt: skip
    assert resp.id.startswith("cmpl-") and resp.object == "text_completion"
    assert resp.choices[0].finish_reason == "length"
    assert resp.usage.completion_tokens == 5


def test_greedy_is_deterministic_and_matches_stream(client: openai.OpenAI) -> None:
    kwargs = dict(model="tiny", prompt="Hello world", max_tokens=10, temperature=0)
    kwargs["extra_body"] = {"ignore_eos": True}
    first = client.completions.create(**kwargs).choices[0].text
    second = client.completions.create(**kwargs).choices[0].text
    assert first == second
    streamed = "".join(
        c.choices[0].text for c in client.completions.create(stream=True, **kwargs) if c.choices
    )
    assert streamed == first


def test_chat_stream_with_usage(client: openai.OpenAI) -> None:
    stream = client.chat.completions.create(
        model="tiny", messages=MESSAGES, max_tokens=6, stream=True,
        stream_options={"include_usage": True}, extra_body={"ignore_eos": True},
    )  # fmt: skip
    chunks = list(stream)
    assert chunks[0].choices[0].delta.role == "assistant"
    assert all(c.object == "chat.completion.chunk" for c in chunks)
    assert len({c.id for c in chunks}) == 1
    finishes = [c.choices[0].finish_reason for c in chunks if c.choices]
    assert finishes[-1] == "length" and finishes.count("length") == 1
    last = chunks[-1]
    assert last.choices == [] and last.usage is not None
    assert last.usage.completion_tokens == 6
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert text


def test_n_two_streamed_and_not(client: openai.OpenAI) -> None:
    resp = client.chat.completions.create(
        model="tiny", messages=MESSAGES, max_tokens=5, n=2, seed=3,
        extra_body={"ignore_eos": True},
    )  # fmt: skip
    assert sorted(c.index for c in resp.choices) == [0, 1]
    assert resp.usage.completion_tokens == 10
    stream = client.chat.completions.create(
        model="tiny", messages=MESSAGES, max_tokens=5, n=2, seed=3, stream=True,
        extra_body={"ignore_eos": True},
    )  # fmt: skip
    texts = {0: "", 1: ""}
    finished = set()
    for chunk in stream:
        for choice in chunk.choices:
            texts[choice.index] += choice.delta.content or ""
            if choice.finish_reason:
                finished.add(choice.index)
    assert finished == {0, 1}
    assert texts == {c.index: c.message.content for c in resp.choices}  # same seed, same text


def test_seed_reproducible(client: openai.OpenAI) -> None:
    def sample(seed: int) -> str:
        resp = client.completions.create(
            model="tiny", prompt="Once upon a time", max_tokens=12, temperature=1.0, seed=seed,
            extra_body={"ignore_eos": True},
        )  # fmt: skip
        return resp.choices[0].text

    assert sample(7) == sample(7)
    assert len({sample(s) for s in (1, 2, 3, 4)}) > 1


def test_stop_string(client: openai.OpenAI) -> None:
    base = client.completions.create(
        model="tiny", prompt="Hello", max_tokens=12, temperature=0, extra_body={"ignore_eos": True}
    ).choices[0]
    text = base.text
    assert len(text) >= 4
    stop = text[2:4]
    first = text.find(stop)
    resp = client.completions.create(
        model="tiny", prompt="Hello", max_tokens=12, temperature=0, stop=[stop],
        extra_body={"ignore_eos": True},
    ).choices[0]  # fmt: skip
    assert resp.finish_reason == "stop"
    assert resp.text == text[:first]


def test_chat_logprobs(client: openai.OpenAI) -> None:
    resp = client.chat.completions.create(
        model="tiny", messages=MESSAGES, max_tokens=4, logprobs=True, top_logprobs=3,
        temperature=0, extra_body={"ignore_eos": True},
    )  # fmt: skip
    content = resp.choices[0].logprobs.content
    assert len(content) == 4
    for entry in content:
        assert entry.logprob <= 0
        if "\ufffd" not in entry.token:
            assert entry.bytes == list(entry.token.encode())
        assert len(entry.top_logprobs) == 3
        top = [t.logprob for t in entry.top_logprobs]
        assert top == sorted(top, reverse=True)
        assert entry.logprob == pytest.approx(top[0], abs=1e-4)  # greedy takes the best
    raw = b"".join(bytes(e.bytes) for e in content)
    assert raw.decode("utf-8", errors="replace") == resp.choices[0].message.content


def test_completion_logprobs_and_echo(client: openai.OpenAI) -> None:
    prompt = "Hello world"
    resp = client.completions.create(
        model="tiny", prompt=prompt, max_tokens=3, logprobs=2, echo=True, temperature=0,
        extra_body={"ignore_eos": True},
    )  # fmt: skip
    choice = resp.choices[0]
    assert choice.text.startswith(prompt)
    lp = choice.logprobs
    assert len(lp.tokens) == len(lp.token_logprobs) == len(lp.text_offset)
    n_prompt = len(server_tokens(client, prompt))
    assert len(lp.tokens) == n_prompt + 3
    assert lp.token_logprobs[0] is None  # first prompt token has no logprob
    assert all(v <= 0 for v in lp.token_logprobs[-3:])
    assert lp.text_offset == sorted(lp.text_offset)
    assert all(len(t) >= 2 for t in lp.top_logprobs[-3:])


def server_tokens(client: openai.OpenAI, prompt: str) -> list[int]:
    base = str(client.base_url).rstrip("/").removesuffix("/v1")
    r = httpx.post(
        base + "/tokenize", json={"prompt": prompt}, headers={"Authorization": f"Bearer {API_KEY}"}
    )
    return list(r.json()["tokens"])


def test_batch_prompts_index_across(client: openai.OpenAI) -> None:
    resp = client.completions.create(
        model="tiny", prompt=["Hello", "The sky is"], max_tokens=2, n=2,
        extra_body={"ignore_eos": True},
    )  # fmt: skip
    assert sorted(c.index for c in resp.choices) == [0, 1, 2, 3]
    assert resp.usage.completion_tokens == 8


def test_token_id_prompts(server: ServerProcess, client: openai.OpenAI) -> None:
    ids = httpx.post(
        server.base_url + "/tokenize", json={"prompt": "Hello world"}, headers=server.headers
    ).json()["tokens"]
    by_text = client.completions.create(
        model="tiny", prompt="Hello world", max_tokens=4, temperature=0,
        extra_body={"ignore_eos": True},
    )  # fmt: skip
    by_ids = client.completions.create(
        model="tiny", prompt=ids, max_tokens=4, temperature=0, extra_body={"ignore_eos": True}
    )
    assert by_ids.choices[0].text == by_text.choices[0].text
    batch = client.completions.create(
        model="tiny", prompt=[ids, ids], max_tokens=4, temperature=0,
        extra_body={"ignore_eos": True},
    )  # fmt: skip
    assert [c.text for c in batch.choices] == [by_text.choices[0].text] * 2


def test_tokenize_detokenize_roundtrip(server: ServerProcess) -> None:
    tok = httpx.post(
        server.base_url + "/tokenize", json={"prompt": "Café 東京"}, headers=server.headers
    ).json()
    assert tok["count"] == len(tok["tokens"]) and tok["max_model_len"] > 0
    text = httpx.post(
        server.base_url + "/detokenize", json={"tokens": tok["tokens"]}, headers=server.headers
    ).json()["prompt"]
    assert text == "Café 東京"
    chat = httpx.post(
        server.base_url + "/tokenize", json={"messages": MESSAGES}, headers=server.headers
    ).json()
    assert chat["count"] > tok["count"]


def test_request_id_echoed_and_used(server: ServerProcess) -> None:
    body = {"model": "tiny", "prompt": "Hi", "max_tokens": 2}
    r = httpx.post(
        server.base_url + "/v1/completions",
        json=body,
        headers={**server.headers, "X-Request-Id": "my-req-42"},
    )
    assert r.status_code == 200
    assert r.headers["x-request-id"] == "my-req-42"
    assert r.json()["id"] == "cmpl-my-req-42"
    r2 = httpx.post(server.base_url + "/v1/completions", json=body, headers=server.headers)
    assert len(r2.headers["x-request-id"]) >= 16


def test_raw_sse_framing(server: ServerProcess) -> None:
    body = {"model": "tiny", "messages": MESSAGES, "max_tokens": 3, "stream": True}
    with httpx.stream(
        "POST", server.base_url + "/v1/chat/completions", json=body, headers=server.headers
    ) as r:
        assert r.headers["content-type"].startswith("text/event-stream")
        raw = r.read().decode()
    events = raw.split("\n\n")
    assert events[-1] == "" and events[-2] == "data: [DONE]"
    for event in events[:-2]:
        assert event.startswith("data: ")
        json.loads(event[len("data: ") :])


def test_version_and_health(server: ServerProcess) -> None:
    assert httpx.get(server.base_url + "/health").status_code == 200
    r = httpx.get(server.base_url + "/version", headers=server.headers)
    assert r.status_code == 200 and r.json()["version"]


def test_unknown_fields_are_ignored(client: openai.OpenAI) -> None:
    resp = client.chat.completions.create(
        model="tiny", messages=MESSAGES, max_tokens=2, user="someone",
        extra_body={"some_future_field": {"x": 1}},
    )  # fmt: skip
    assert resp.choices[0].message.content is not None
