"""The tokenizer built from GGUF metadata: merges, special tokens, round trips, chat template."""

from __future__ import annotations

from pathlib import Path

import pytest
import transformers
from engine_gguf.format import GGUFFormat
from gguf_builders import CHAT_TEMPLATE, TinySpec, tiny_vocab, write_tiny_gguf

TEXTS = [
    "hello world",
    "Hello, World! héllo 東京 — 123 + 4.5e-3",
    "  leading spaces\n\ttabs and\r\nnewlines  ",
    "emoji 🙂 and <|im_end|> inside text",
]
MESSAGES = [
    {"role": "system", "content": "Be brief."},
    {"role": "user", "content": "What is the capital of France?"},
]


@pytest.fixture(scope="module")
def tiny_tokenizer(tmp_path_factory: pytest.TempPathFactory):
    tiny = write_tiny_gguf(tmp_path_factory.mktemp("tok") / "tiny.gguf", TinySpec())
    return GGUFFormat(tiny.path).load_tokenizer()


def test_tiny_tokenizer_uses_the_merges(tiny_tokenizer) -> None:
    tokens, _, _ = tiny_vocab()
    assert isinstance(tiny_tokenizer, transformers.PreTrainedTokenizerFast)
    expected = [tokens.index("hello"), tokens.index("Ġworld")]
    assert tiny_tokenizer("hello world").input_ids == expected
    # Bytes without a merge stay single byte tokens.
    assert tiny_tokenizer("hz").input_ids == [tokens.index("h"), tokens.index("z")]


def test_tiny_tokenizer_special_tokens(tiny_tokenizer) -> None:
    tokens, _, _ = tiny_vocab()
    assert tiny_tokenizer.bos_token == "<|im_start|>"
    assert tiny_tokenizer.eos_token == "<|im_end|>"
    assert tiny_tokenizer.eos_token_id == tokens.index("<|im_end|>")
    ids = tiny_tokenizer("<|im_start|>hello<|im_end|>").input_ids
    assert ids == [tokens.index("<|im_start|>"), tokens.index("hello"), tokens.index("<|im_end|>")]
    assert tiny_tokenizer.decode(ids, skip_special_tokens=True) == "hello"


@pytest.mark.parametrize("text", TEXTS)
def test_tiny_tokenizer_round_trips(tiny_tokenizer, text: str) -> None:
    assert tiny_tokenizer.decode(tiny_tokenizer(text).input_ids) == text


def test_tiny_chat_template(tiny_tokenizer) -> None:
    assert tiny_tokenizer.chat_template == CHAT_TEMPLATE
    rendered = tiny_tokenizer.apply_chat_template(
        MESSAGES, tokenize=False, add_generation_prompt=True
    )
    assert rendered == (
        "<|im_start|>system\nBe brief.<|im_end|>\n"
        "<|im_start|>user\nWhat is the capital of France?<|im_end|>\n"
        "<|im_start|>assistant\n"
    )


def test_gguf_without_tokenizer_is_a_clear_error(tmp_path: Path) -> None:
    tiny = write_tiny_gguf(tmp_path / "tiny.gguf", TinySpec(with_tokenizer=False))
    fmt = GGUFFormat(tiny.path)
    assert fmt.load_config().vocab_size == tiny.vocab_size  # from token_embd rows
    with pytest.raises(ValueError, match="holds no tokenizer.*--tokenizer"):
        fmt.load_tokenizer()


@pytest.mark.parametrize("text", TEXTS)
def test_smollm2_round_trips(smollm2_tokenizer, text: str) -> None:
    assert smollm2_tokenizer.decode(smollm2_tokenizer(text).input_ids) == text


def test_smollm2_special_tokens_and_digits(smollm2_tokenizer) -> None:
    tok = smollm2_tokenizer
    assert len(tok) == 49152
    assert (tok.bos_token_id, tok.eos_token_id) == (1, 2)
    assert tok.convert_ids_to_tokens([0, 1, 2]) == ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
    assert tok("<|im_start|>user").input_ids[0] == 1  # special tokens stay whole, no BOS added
    # llama.cpp's "smollm" pre-tokenizer splits every digit on its own.
    ids = tok("In 2024, 31415 pies").input_ids
    digits = [t for t in tok.convert_ids_to_tokens(ids) if any(c.isdigit() for c in t)]
    assert digits == list("202431415")


def test_smollm2_chat_template(smollm2_tokenizer) -> None:
    rendered = smollm2_tokenizer.apply_chat_template(
        MESSAGES[1:], tokenize=False, add_generation_prompt=True
    )
    assert rendered == (
        "<|im_start|>system\nYou are a helpful AI assistant named SmolLM, trained by Hugging "
        "Face<|im_end|>\n<|im_start|>user\nWhat is the capital of France?<|im_end|>\n"
        "<|im_start|>assistant\n"
    )
