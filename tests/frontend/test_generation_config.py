"""Sampling defaults from generation_config.json, overrides, and request merging."""

from __future__ import annotations

import json
from typing import Any

import pytest
from engine.generation_config import (
    describe_sampling_defaults,
    merge_sampling_params,
    resolve_sampling_defaults,
    sampling_default_sources,
)
from engine.tokenization import collect_eos_token_ids

MODEL_GEN = {
    "temperature": 0.6,
    "top_p": 0.95,
    "top_k": 20,
    "max_new_tokens": 64,
    "do_sample": True,
    "eos_token_id": [7, 9],
    "bos_token_id": 1,
}


def test_auto_reads_model_defaults() -> None:
    d = resolve_sampling_defaults("auto", MODEL_GEN)
    assert d == {"temperature": 0.6, "top_p": 0.95, "top_k": 20, "max_tokens": 64}


def test_vllm_mode_is_neutral() -> None:
    assert resolve_sampling_defaults("vllm", MODEL_GEN) == {}
    params = merge_sampling_params({}, {})
    assert (params.temperature, params.top_p, params.top_k, params.max_tokens) == (
        1.0,
        1.0,
        0,
        None,
    )


def test_folder_mode_and_overrides(tmp_path: Any) -> None:
    (tmp_path / "generation_config.json").write_text(json.dumps({"temperature": 0.3}))
    d = resolve_sampling_defaults(
        str(tmp_path), MODEL_GEN, {"top_p": 0.5, "max_new_tokens": 8, "temperature": 0.1}
    )
    assert d == {"temperature": 0.1, "top_p": 0.5, "max_tokens": 8}
    with pytest.raises(ValueError, match="not auto, vllm or an existing folder"):
        resolve_sampling_defaults("/no/such/dir", MODEL_GEN)
    with pytest.raises(ValueError, match="'temprature' is not a sampling field"):
        resolve_sampling_defaults("auto", MODEL_GEN, {"temprature": 0.1})


def test_request_fields_win_and_unset_fields_take_defaults() -> None:
    defaults = resolve_sampling_defaults("auto", MODEL_GEN)
    p = merge_sampling_params(defaults, {"temperature": 0.0, "top_p": None, "seed": 3})
    assert p.temperature == 0.0  # set, even though falsy
    assert p.top_p == 0.95 and p.top_k == 20 and p.max_tokens == 64 and p.seed == 3
    p2 = merge_sampling_params(defaults, {"max_tokens": 5})
    assert p2.max_tokens == 5
    with pytest.raises(ValueError, match="unknown sampling field"):
        merge_sampling_params(defaults, {"bogus": 1})


def test_eos_ids_from_tokenizer_and_generation_config(byte_tokenizer: Any) -> None:
    eos = byte_tokenizer.eos_token_id
    assert collect_eos_token_ids(byte_tokenizer, MODEL_GEN) == [eos, 7, 9]
    assert collect_eos_token_ids(byte_tokenizer, {"eos_token_id": eos}) == [eos]
    assert collect_eos_token_ids(byte_tokenizer, {}) == [eos]


def test_sources_and_the_startup_line_name_where_each_default_came_from(tmp_path: Any) -> None:
    model = {"temperature": 0.6, "top_p": 0.95, "max_new_tokens": 64}
    override = {"temperature": 0.2}
    defaults = resolve_sampling_defaults("auto", model, override)
    sources = sampling_default_sources("auto", model, override)
    assert sources == {
        "temperature": "--override-generation-config",
        "top_p": "the model's generation_config",
        "max_tokens": "the model's generation_config",
    }
    line = describe_sampling_defaults(defaults, sources)
    assert "temperature=0.2 (--override-generation-config)" in line
    assert "top_p=0.95 (the model's generation_config)" in line
    assert "top_k, min_p: neutral" in line
    (tmp_path / "generation_config.json").write_text(json.dumps({"top_k": 5}))
    assert sampling_default_sources(str(tmp_path), model, None) == {
        "top_k": f"--generation-config {tmp_path}"
    }
    assert sampling_default_sources("vllm", model, None) == {}


def test_the_default_model_gets_its_card_sampling_unless_the_user_set_it() -> None:
    from engine.cli.serve import apply_default_model_sampling
    from engine.config import EngineArgs

    args = EngineArgs(model="x.gguf")
    apply_default_model_sampling(args)
    assert args.override_generation_config == {"temperature": 0.2, "top_p": 0.9}
    args = EngineArgs(model="x.gguf", override_generation_config={"temperature": 0.7})
    apply_default_model_sampling(args)
    assert args.override_generation_config == {"temperature": 0.7, "top_p": 0.9}
    args = EngineArgs(model="x.gguf", generation_config="vllm")
    apply_default_model_sampling(args)
    assert args.override_generation_config == {}
