"""Several prompts times ``n`` through ``engine serve`` (the real engine) and the ``openai``
client: the one fan-out (``engine.fan_out``) numbers choice ``p * n + i`` as each prompt
alone numbers its samples, names the engine requests ``{id}-{p}``, and a client that
leaves aborts every sample of every prompt."""

from __future__ import annotations

import time

import httpx
import openai
import pytest
from conftest import API_KEY, ServerProcess
from test_load_and_metrics import load, metric, scrape, wait_idle

pytestmark = pytest.mark.timeout(120)
PROMPTS = ["Once upon a time", "The sky is"]
SAMPLING = {"n": 2, "seed": 11, "max_tokens": 6, "temperature": 1.0}


@pytest.fixture(scope="module")
def client(server: ServerProcess) -> openai.OpenAI:
    return openai.OpenAI(base_url=server.base_url + "/v1", api_key=API_KEY, max_retries=0)


def test_batch_times_n_is_each_prompt_alone(client: openai.OpenAI) -> None:
    extra = {"ignore_eos": True}
    batch = client.completions.create(model="tiny", prompt=PROMPTS, extra_body=extra, **SAMPLING)
    alone = [
        client.completions.create(model="tiny", prompt=p, extra_body=extra, **SAMPLING)
        for p in PROMPTS
    ]
    texts = {c.index: c.text for c in batch.choices}
    assert sorted(texts) == [0, 1, 2, 3]
    assert texts == {p * 2 + c.index: c.text for p, a in enumerate(alone) for c in a.choices}
    assert texts[0] != texts[1]  # a prompt's samples have seeds 11 and 12
    assert batch.usage.prompt_tokens == sum(a.usage.prompt_tokens for a in alone)
    assert batch.usage.completion_tokens == 4 * 6
    stream = client.completions.create(
        model="tiny", prompt=PROMPTS, echo=True, stream=True, extra_body=extra, **SAMPLING
    )
    chunks = [(c.choices[0].index, c.choices[0].text, c.choices[0].finish_reason) for c in stream]
    assert [(i, t) for i, t, _ in chunks[:4]] == [(0, PROMPTS[0]), (1, PROMPTS[0]),
                                                   (2, PROMPTS[1]), (3, PROMPTS[1])]  # fmt: skip
    streamed = {i: "" for i in range(4)}
    for index, text, _ in chunks:
        streamed[index] += text
    assert streamed == {i: PROMPTS[i // 2] + t for i, t in texts.items()}
    assert sorted(i for i, _, finish in chunks if finish) == [0, 1, 2, 3]


def _aborted(server: ServerProcess) -> float:
    return metric(scrape(server), "engine:request_success_total", 'finish_reason="abort"')


def test_sub_ids_and_a_disconnect_aborts_every_sample(server: ServerProcess) -> None:
    start = wait_idle(server)
    aborted = _aborted(server)
    url = server.base_url + "/v1/completions"
    body = {"model": "tiny", "prompt": PROMPTS, "n": 2, "max_tokens": 200, "stream": True,
            "ignore_eos": True}  # fmt: skip
    with httpx.stream(
        "POST", url, json=body, headers={**server.headers, "X-Request-Id": "fan-7"}, timeout=60
    ) as r:
        lines = r.iter_lines()
        for _ in range(12):  # a few chunks in: every sample runs
            next(lines)
        busy = load(server)
        assert busy["num_requests_running"] + busy["num_requests_waiting"] == 4
        taken = httpx.post(
            url,
            json={"model": "tiny", "prompt": "hi", "max_tokens": 2},
            headers={**server.headers, "X-Request-Id": "fan-7-1"},  # prompt 1's engine request
        )
        assert taken.status_code == 409, taken.text
        assert "'fan-7-1' is already running" in taken.json()["error"]["message"]
    deadline = time.monotonic() + 20
    while _aborted(server) < aborted + 4 and time.monotonic() < deadline:
        time.sleep(0.1)
    assert _aborted(server) == aborted + 4  # 2 prompts x 2 samples, none left running
    end = wait_idle(server)
    assert end["num_free_blocks"] == start["num_free_blocks"]
    assert end["num_http_requests_in_flight"] == 0
