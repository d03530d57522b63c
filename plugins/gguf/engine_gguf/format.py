"""``GGUFFormat``: a GGUF checkpoint as config, tokenizer and dequantized weights."""

from __future__ import annotations

from collections.abc import Iterator
from functools import cached_property
from pathlib import Path
from typing import Any, ClassVar

import torch
from engine_sdk.interfaces.model_format import ModelFormat

from engine_gguf.config import build_hf_config
from engine_gguf.metadata import GGUFFile
from engine_gguf.rope import tidy_float
from engine_gguf.tokenizer import load_gguf_tokenizer
from engine_gguf.weights import iter_hf_weights

SUFFIX = ".gguf"

# general.sampling.* (llama.cpp) -> generation_config.json keys
_SAMPLING_KEYS = {
    "general.sampling.temp": "temperature",
    "general.sampling.top_k": "top_k",
    "general.sampling.top_p": "top_p",
    "general.sampling.min_p": "min_p",
    "general.sampling.penalty_repeat": "repetition_penalty",
}


# A folder holding these is a Hugging Face checkpoint, even with a .gguf beside them.
_HF_WEIGHT_SUFFIXES = (".safetensors", ".bin")


def find_gguf_file(path: Path) -> Path | None:
    """The GGUF file ``path`` names: itself, or the only ``*.gguf`` in a folder.

    A folder that also holds HF weights (``*.safetensors``, ``*.bin``) is left to the HF
    loader; name the ``.gguf`` file itself to load it instead.
    """
    path = Path(path)
    if path.is_file():
        return path if path.suffix.lower() == SUFFIX else None
    if not path.is_dir():
        return None
    files = [p for p in path.iterdir() if p.is_file()]
    if any(p.suffix.lower() in _HF_WEIGHT_SUFFIXES for p in files):
        return None
    found = [p for p in files if p.suffix.lower() == SUFFIX]
    return found[0] if len(found) == 1 else None


class GGUFFormat(ModelFormat):
    """Loads a single-file GGUF checkpoint (llama, phi3, qwen2, qwen3), dequantizing on load."""

    name: ClassVar[str] = "gguf"

    def __init__(self, path: Path) -> None:
        super().__init__(Path(path))
        file = find_gguf_file(self.path)
        if file is None:
            raise ValueError(
                f"--model {self.path} is not a .gguf file or a folder holding exactly one "
                ".gguf file; name the file itself"
            )
        self.file = file

    @classmethod
    def claims(cls, path: Path) -> bool:
        """A ``.gguf`` file, or a folder holding exactly one ``.gguf`` file."""
        return find_gguf_file(Path(path)) is not None

    @cached_property
    def gguf_file(self) -> GGUFFile:
        """The parsed file (read once, memory-mapped)."""
        return GGUFFile(self.file)

    @cached_property
    def _config(self) -> Any:
        return build_hf_config(self.gguf_file)

    def load_config(self) -> Any:
        """A ``LlamaConfig`` / ``Qwen2Config`` / ``Qwen3Config`` built from the metadata."""
        return self._config

    def load_tokenizer(self) -> Any:
        """A ``PreTrainedTokenizerFast`` with the file's chat template."""
        return load_gguf_tokenizer(self.gguf_file)

    def iter_weights(self, dtype: torch.dtype) -> Iterator[tuple[str, torch.Tensor]]:
        """(HF parameter name, tensor) pairs, dequantized to ``dtype``.

        A tied model yields no ``lm_head.weight`` (``config.tie_word_embeddings``).
        """
        config = self._config
        return iter_hf_weights(
            self.gguf_file, config.num_attention_heads, config.num_key_value_heads, dtype
        )

    def generation_config(self) -> dict[str, Any]:
        """Sampling defaults from ``general.sampling.*`` and the end-of-turn token ids."""
        gf = self.gguf_file
        out: dict[str, Any] = {}
        for key, hf_key in _SAMPLING_KEYS.items():
            value = gf.get(key)
            if value is not None:
                out[hf_key] = tidy_float(value) if isinstance(value, float) else value
        eos_ids = []
        for key in ("eos_token_id", "eot_token_id", "eom_token_id"):
            token_id = gf.get(f"tokenizer.ggml.{key}")
            if token_id is not None and token_id not in eos_ids:
                eos_ids.append(int(token_id))
        if eos_ids:
            out["eos_token_id"] = eos_ids if len(eos_ids) > 1 else eos_ids[0]
        bos = gf.get("tokenizer.ggml.bos_token_id")
        if bos is not None:
            out["bos_token_id"] = int(bos)
        return out
