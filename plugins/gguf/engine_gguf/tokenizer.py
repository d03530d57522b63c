"""The tokenizer stored in a GGUF file, as a ``transformers.PreTrainedTokenizerFast``.

transformers converts GGUF vocabularies itself (``from_pretrained(folder, gguf_file=...)``,
offline: it only reads the local file). Its converter keeps GPT-2's default split for
pre-tokenizer names it does not know; llama.cpp splits digits one by one for the
StarCoder family (``smollm``, ``starcoder``, ...), so those get their split fixed here.
"""

from __future__ import annotations

from pathlib import Path

import transformers
from tokenizers import Regex, pre_tokenizers

from engine_gguf.metadata import GGUFFile

# llama.cpp pre-tokenizer names whose regex list is ["\p{N}", GPT-2 regex]
# (llama-vocab.cpp, LLAMA_VOCAB_PRE_TYPE_STARCODER / SMOLLM / ...).
_SINGLE_DIGIT_PRE = frozenset(
    {"starcoder", "refact", "command-r", "smollm", "codeshell", "exaone", "minerva-7b"}
)


def load_gguf_tokenizer(gf: GGUFFile) -> transformers.PreTrainedTokenizerFast:
    """The tokenizer of ``gf``, with the chat template from ``tokenizer.chat_template``."""
    if not gf.has("tokenizer.ggml.tokens"):
        raise ValueError(
            f"GGUF file {gf.path} holds no tokenizer (tokenizer.ggml.tokens); pass "
            "--tokenizer with a Hugging Face tokenizer folder"
        )
    path = Path(gf.path)
    try:
        tokenizer: transformers.PreTrainedTokenizerFast = (
            transformers.PreTrainedTokenizerFast.from_pretrained(
                str(path.parent), gguf_file=path.name, local_files_only=True
            )
        )
    except (ValueError, KeyError, NotImplementedError) as e:
        model = gf.get("tokenizer.ggml.model")
        raise ValueError(
            f"cannot build the tokenizer of GGUF file {path} (tokenizer.ggml.model={model!r}): "
            f"{e}. Pass --tokenizer with a Hugging Face tokenizer folder"
        ) from e
    if gf.get("tokenizer.ggml.pre") in _SINGLE_DIGIT_PRE:
        tokenizer.backend_tokenizer.pre_tokenizer = pre_tokenizers.Sequence(
            [
                pre_tokenizers.Split(Regex(r"\p{N}"), behavior="isolated"),
                pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True),
            ]
        )
    chat_template = gf.get("tokenizer.chat_template")
    if chat_template and not tokenizer.chat_template:
        tokenizer.chat_template = chat_template
    return tokenizer
