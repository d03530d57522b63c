"""The Rust DecodeStream path of the detokenizer equals its Python path, delta for delta."""

from __future__ import annotations

import random
from typing import Any

import pytest
from engine.tokenization import IncrementalDetokenizer


class PlainTokenizer:
    """Only ``decode``: not a transformers fast tokenizer, so the Python path runs."""

    def __init__(self, tokenizer: Any) -> None:
        self._tokenizer = tokenizer

    def decode(self, ids: list[int], **kwargs: Any) -> str:
        text: str = self._tokenizer.decode(ids, **kwargs)
        return text


def _run(detok: IncrementalDetokenizer, chunks: list[list[int]]) -> list[str]:
    return [detok.update(chunk) for chunk in chunks] + [detok.flush()]


def _random_ids(rng: random.Random, tok: Any, n: int) -> list[int]:
    """Real text with random ids mixed in: split characters, stray bytes, special tokens."""
    text_ids = tok.encode("héllo 世界 😀 the END of the 👩‍👩‍👧 story", add_special_tokens=False)
    out = []
    for _ in range(n):
        r = rng.random()
        if r < 0.6:
            out.append(rng.choice(text_ids))
        elif r < 0.95:
            out.append(rng.randrange(len(tok)))
        else:
            out.append(tok.all_special_ids[rng.randrange(len(tok.all_special_ids))])
    return out


def test_fast_tokenizers_take_the_stream_path(any_tokenizer: Any) -> None:
    prompt = any_tokenizer.encode("hello world", add_special_tokens=False)
    assert IncrementalDetokenizer(any_tokenizer, prompt)._stream is not None
    assert IncrementalDetokenizer(PlainTokenizer(any_tokenizer), prompt)._stream is None


def test_a_tokenizer_that_overrides_decode_keeps_its_decode(byte_tokenizer: Any) -> None:
    cls = type(byte_tokenizer)

    class Shouting(cls):  # type: ignore[misc, valid-type]
        def decode(self, ids: Any, **kwargs: Any) -> str:
            return str(super().decode(ids, **kwargs)).upper()

    tok = Shouting(tokenizer_object=byte_tokenizer.backend_tokenizer)
    prompt = tok.encode("hi", add_special_tokens=False)
    detok = IncrementalDetokenizer(tok, prompt)
    assert detok._stream is None
    out = "".join(detok.update([t]) for t in tok.encode(" the end", add_special_tokens=False))
    assert out == " THE END"


@pytest.mark.parametrize("skip_special_tokens", [True, False])
@pytest.mark.parametrize("seed", range(16))
def test_stream_and_python_paths_agree(
    any_tokenizer: Any, seed: int, skip_special_tokens: bool
) -> None:
    tok = any_tokenizer
    rng = random.Random(seed)
    prompt = tok.encode("The story of 世界: ", add_special_tokens=False)
    output = _random_ids(rng, tok, 60)
    chunks, i = [], 0
    while i < len(output):
        size = 1 if rng.random() < 0.7 else rng.randrange(2, 5)
        chunks.append(output[i : i + size])
        i += size
    fast = IncrementalDetokenizer(tok, prompt, skip_special_tokens)
    slow = IncrementalDetokenizer(PlainTokenizer(tok), prompt, skip_special_tokens)
    assert fast._stream is not None
    assert _run(fast, chunks) == _run(slow, chunks)
    assert fast.output_text == slow.output_text


@pytest.mark.parametrize("seed", range(8))
def test_paths_agree_after_a_prompt_ending_in_random_ids(any_tokenizer: Any, seed: int) -> None:
    """Prompts that end inside a character (the held-back ids) or in stray bytes."""
    tok = any_tokenizer
    rng = random.Random(100 + seed)
    ids = _random_ids(rng, tok, 40)
    prompt, output = ids[:20], ids[20:]
    fast = IncrementalDetokenizer(tok, prompt)
    slow = IncrementalDetokenizer(PlainTokenizer(tok), prompt)
    chunks = [[t] for t in output]
    assert _run(fast, chunks) == _run(slow, chunks)


def test_skipped_special_token_keeps_the_left_context(sp_tokenizer: Any) -> None:
    """SentencePiece drops the leading space of a window's first word: a skipped special
    token must not become the whole left context of the next word."""
    tok = sp_tokenizer
    ids = tok.encode("hello world", add_special_tokens=False)
    assert tok.convert_ids_to_tokens(ids[1:2]) == ["▁wor"]
    prompt, world = ids[:1], ids[1:]
    eos = tok.eos_token_id
    for t in (tok, PlainTokenizer(tok)):
        detok = IncrementalDetokenizer(t, prompt, skip_special_tokens=True)
        assert "".join(detok.update([i]) for i in [eos, *world]) == " world"
