"""Embedding models offline (``LLM.embed``) against transformers on tiny random models:
Qwen3 last-token and Llama mean pooling (cosine >= 0.9999 in float32), over chunked
prompts and with the prefix cache on, a bare ``Qwen3Model`` checkpoint embedded by
default (``--task auto``), the sentence-transformers pooling config, Matryoshka
``dimensions``, and the errors for the wrong task."""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

import pytest
import torch
from engine.entrypoints.llm import LLM

pytestmark = pytest.mark.timeout(300)

BASE: dict[str, Any] = {
    "device": "cpu", "dtype": "float32", "block_size": 4, "kv_cache_memory_bytes": 1 << 20,
    "max_num_batched_tokens": 16, "max_num_seqs": 4,
}  # fmt: skip
PROMPTS = [
    "hello world, this is a test of the embedding model and its pooling",
    "short",
    "another prompt here that is long enough to be chunked over steps",
    "hello world, this is a test of the embedding model and its pooling",  # cached prefix
]


@pytest.fixture(scope="module")
def qwen3_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    from engine_sdk.testing.models import build_tiny_model

    return build_tiny_model(tmp_path_factory.mktemp("q3"), "Qwen3ForCausalLM")


@pytest.fixture(scope="module")
def llama_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    from engine_sdk.testing.models import build_tiny_model

    return build_tiny_model(tmp_path_factory.mktemp("llama"), "LlamaForCausalLM")


def reference(model_dir: Path, token_ids: list[int], pooling: str) -> torch.Tensor:
    """transformers' body (``AutoModel``): last-token or mean pooling, L2-normalized."""
    from transformers import AutoModel

    model = AutoModel.from_pretrained(str(model_dir), dtype=torch.float32)
    with torch.no_grad():
        hidden = model(torch.tensor([token_ids])).last_hidden_state[0]
    pooled = hidden[-1] if pooling == "last" else hidden.mean(dim=0)
    return torch.nn.functional.normalize(pooled, dim=0)


def cosines(model_dir: Path, outs: list[Any], pooling: str) -> list[float]:
    refs = [reference(model_dir, o.prompt_token_ids, pooling) for o in outs]
    return [float(torch.dot(r, torch.tensor(o.embedding))) for r, o in zip(refs, outs, strict=True)]


@pytest.mark.parametrize(("arch", "pooling"), [("qwen3", "last"), ("llama", "mean")])
def test_parity_with_transformers(
    arch: str, pooling: str, qwen3_dir: Path, llama_dir: Path
) -> None:
    model_dir = qwen3_dir if arch == "qwen3" else llama_dir
    llm = LLM(str(model_dir), task="embed", **BASE)
    assert llm.engine.pooling.pooling == pooling
    outs = llm.embed(PROMPTS, use_tqdm=False)
    assert [len(o.prompt_token_ids) > 16 for o in outs] == [True, False, True, True]  # chunked
    assert all(c >= 0.9999 for c in cosines(model_dir, outs, pooling))
    for o in outs:
        assert abs(sum(x * x for x in o.embedding) - 1.0) < 1e-5
    assert outs[0].embedding == pytest.approx(outs[3].embedding, abs=1e-5)
    # Prefill-only: nothing is left running or holding blocks.
    stats = llm.stats()
    assert stats.num_running == 0 and stats.num_waiting == 0 and stats.kv_cache_usage == 0.0
    # Token ids in, the same vector out.
    again = llm.embed({"prompt_token_ids": outs[2].prompt_token_ids}, use_tqdm=False)
    assert again[0].embedding == pytest.approx(outs[2].embedding, abs=1e-5)


def test_bare_body_checkpoint_embeds_by_default(qwen3_dir: Path, tmp_path: Path) -> None:
    from transformers import AutoModel

    bare = tmp_path / "bare"
    AutoModel.from_pretrained(str(qwen3_dir), dtype=torch.float32).save_pretrained(str(bare))
    for name in ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json"):
        if (qwen3_dir / name).exists():
            shutil.copy(qwen3_dir / name, bare / name)
    assert json.loads((bare / "config.json").read_text())["architectures"] == ["Qwen3Model"]
    llm = LLM(str(bare), **BASE)  # task auto: only a pooling model serves Qwen3Model
    outs = llm.embed(PROMPTS[:2], use_tqdm=False)
    assert all(c >= 0.9999 for c in cosines(bare, outs, "last"))


def test_sentence_transformers_pooling_and_matryoshka(qwen3_dir: Path, tmp_path: Path) -> None:
    model_dir = tmp_path / "st"
    shutil.copytree(qwen3_dir, model_dir)
    (model_dir / "1_Pooling").mkdir()
    (model_dir / "1_Pooling" / "config.json").write_text(
        json.dumps({"pooling_mode_mean_tokens": True, "pooling_mode_lasttoken": False})
    )
    config = json.loads((model_dir / "config.json").read_text())
    (model_dir / "config.json").write_text(json.dumps({**config, "matryoshka_dimensions": [8, 16]}))
    llm = LLM(str(model_dir), task="embed", **BASE)
    assert llm.engine.pooling.pooling == "mean"
    full = llm.embed(PROMPTS[:1], normalize=False, use_tqdm=False)[0].embedding
    cut = llm.embed(PROMPTS[:1], dimensions=8, use_tqdm=False)[0].embedding
    expected = torch.nn.functional.normalize(torch.tensor(full[:8]), dim=0)
    assert cut == pytest.approx(expected.tolist(), abs=1e-5)
    with pytest.raises(ValueError, match="Matryoshka dimensions"):
        llm.embed(PROMPTS[:1], dimensions=12, use_tqdm=False)


def test_wrong_task_errors(qwen3_dir: Path) -> None:
    embed = LLM(str(qwen3_dir), task="embed", **BASE)
    with pytest.raises(ValueError, match="LLM.embed"):
        embed.generate("hi")
    with pytest.raises(ValueError, match="does not declare Matryoshka"):
        embed.embed("hi", dimensions=4, use_tqdm=False)
    generate = LLM(str(qwen3_dir), **BASE)  # task auto: Qwen3ForCausalLM generates
    with pytest.raises(ValueError, match="task='embed'"):
        generate.embed("hi")
