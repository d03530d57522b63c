"""``POST /v1/embeddings`` through a real ``engine serve --task embed`` on the tiny Qwen3,
with the official ``openai`` client: vectors equal to transformers' (last-token pooling),
in input order, for strings and token ids, base64 equal to floats, the usage, the errors
for a generating model / an embedding model asked to chat, ``/metrics`` and ``/load``."""

from __future__ import annotations

import base64
import struct
from collections.abc import Iterator
from pathlib import Path

import httpx
import openai
import pytest
import torch
from features_server import Server, start_server

pytestmark = pytest.mark.timeout(300)

INPUTS = ["the first input text", "second", "a third, somewhat longer input to embed"]


@pytest.fixture(scope="module")
def embed_server(tiny_model: Path) -> Iterator[Server]:
    server = start_server(tiny_model, "--task", "embed")
    yield server
    server.stop()


def client(server: Server) -> openai.OpenAI:
    return openai.OpenAI(base_url=server.base_url + "/v1", api_key="none", max_retries=0)


def reference(model_dir: Path, token_ids: list[int]) -> torch.Tensor:
    from transformers import AutoModel

    model = AutoModel.from_pretrained(str(model_dir), dtype=torch.float32)
    with torch.no_grad():
        hidden = model(torch.tensor([token_ids])).last_hidden_state[0]
    return torch.nn.functional.normalize(hidden[-1], dim=0)


def test_embeddings_match_transformers_in_order(embed_server: Server, tiny_model: Path) -> None:
    from transformers import AutoTokenizer

    c = client(embed_server)
    r = c.embeddings.create(model="tiny", input=INPUTS)
    assert [d.index for d in r.data] == [0, 1, 2] and r.model == "tiny"
    tok = AutoTokenizer.from_pretrained(str(tiny_model))
    ids = [tok.encode(text) for text in INPUTS]
    assert r.usage.prompt_tokens == sum(len(i) for i in ids) == r.usage.total_tokens
    for d, token_ids in zip(r.data, ids, strict=True):
        cosine = float(torch.dot(reference(tiny_model, token_ids), torch.tensor(d.embedding)))
        assert cosine >= 0.9999
    by_ids = c.embeddings.create(model="tiny", input=ids[2])
    assert by_ids.data[0].embedding == pytest.approx(r.data[2].embedding, abs=1e-5)
    many = c.embeddings.create(model="tiny", input=ids[:2])
    assert many.data[1].embedding == pytest.approx(r.data[1].embedding, abs=1e-5)
    # base64: little-endian float32, the same vector
    raw = httpx.post(
        embed_server.base_url + "/v1/embeddings",
        json={"model": "tiny", "input": INPUTS[0], "encoding_format": "base64"},
        timeout=60,
    ).json()
    data = base64.b64decode(raw["data"][0]["embedding"])
    decoded = struct.unpack(f"<{len(data) // 4}f", data)
    assert list(decoded) == pytest.approx(r.data[0].embedding, abs=1e-6)


def test_embedding_errors(embed_server: Server, tools_server: Server) -> None:
    c = client(embed_server)
    with pytest.raises(openai.BadRequestError, match="does not declare Matryoshka"):
        c.embeddings.create(model="tiny", input="x", dimensions=4)
    with pytest.raises(openai.BadRequestError, match="--task generate"):
        c.chat.completions.create(model="tiny", messages=[{"role": "user", "content": "x"}])
    with pytest.raises(openai.BadRequestError, match="--task embed"):
        client(tools_server).embeddings.create(model="tiny", input="x")
    r = httpx.post(embed_server.base_url + "/v1/embeddings", json={"input": []}, timeout=30)
    assert r.status_code == 400 and r.json()["error"]["param"] == "input"


def test_metrics_and_load_count_embeddings(embed_server: Server) -> None:
    client(embed_server).embeddings.create(model="tiny", input=["a", "b"])
    text = httpx.get(embed_server.base_url + "/metrics", timeout=30).text
    line = next(
        x for x in text.splitlines() if x.startswith('engine:api_requests_total{kind="embeddings"')
    )
    assert float(line.rsplit(" ", 1)[1]) >= 1
    load = httpx.get(embed_server.base_url + "/load", timeout=30).json()
    assert load["num_requests_in_flight_by_kind"] == {} and load["num_requests_running"] == 0


def test_score_and_rerank_are_embedding_cosines(embed_server: Server) -> None:
    vectors = [
        d.embedding for d in client(embed_server).embeddings.create(model="tiny", input=INPUTS).data
    ]

    def cos(a: int, b: int) -> float:
        return sum(x * y for x, y in zip(vectors[a], vectors[b], strict=True))

    url = embed_server.base_url
    body = {"model": "tiny", "text_1": INPUTS[0], "text_2": INPUTS[1:]}
    r = httpx.post(url + "/v1/score", json=body, timeout=60).json()
    assert [d["index"] for d in r["data"]] == [0, 1] and r["object"] == "list"
    assert [d["score"] for d in r["data"]] == pytest.approx([cos(0, 1), cos(0, 2)], abs=1e-5)
    pairwise = {"text_1": INPUTS[:2], "text_2": INPUTS[1:]}
    r = httpx.post(url + "/score", json=pairwise, timeout=60).json()
    assert [d["score"] for d in r["data"]] == pytest.approx([cos(0, 1), cos(1, 2)], abs=1e-5)
    bad = httpx.post(url + "/v1/score", json={"text_1": INPUTS[:2], "text_2": INPUTS}, timeout=60)
    assert bad.status_code == 400 and bad.json()["error"]["param"] == "text_2"
    rerank = {"model": "tiny", "query": INPUTS[0], "documents": INPUTS[1:] + [INPUTS[0]]}
    r = httpx.post(url + "/rerank", json=rerank, timeout=60).json()
    scores = {res["index"]: res["relevance_score"] for res in r["results"]}
    assert r["results"][0]["index"] == 2 and scores[2] == pytest.approx(1.0, abs=1e-5)
    assert [res["relevance_score"] for res in r["results"]] == sorted(scores.values(), reverse=True)
    assert scores[0] == pytest.approx(cos(0, 1), abs=1e-5)
    assert r["results"][0]["document"]["text"] == INPUTS[0] and r["usage"]["total_tokens"] > 0
    top = httpx.post(url + "/v1/rerank", json={**rerank, "top_n": 1}, timeout=60).json()
    assert [res["index"] for res in top["results"]] == [2]


def test_score_on_a_generating_model_is_400(tools_server: Server) -> None:
    r = httpx.post(tools_server.base_url + "/rerank", json={"query": "q", "documents": ["d"]})
    assert r.status_code == 400 and "--task embed" in r.json()["error"]["message"]
