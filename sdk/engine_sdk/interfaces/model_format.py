"""The checkpoint-format contract (for example GGUF): config, tokenizer and weights."""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Iterator
from pathlib import Path
from typing import Any, ClassVar

import torch


class ModelFormat(ABC):
    """Reads one checkpoint that is not a Hugging Face folder."""

    name: ClassVar[str] = ""

    def __init__(self, path: Path) -> None:
        self.path = path

    @classmethod
    @abstractmethod
    def claims(cls, path: Path) -> bool:
        """Whether this format reads ``path`` (a file or folder)."""

    @abstractmethod
    def load_config(self) -> Any:
        """A ``transformers.PretrainedConfig`` whose ``architectures`` names the model."""

    @abstractmethod
    def load_tokenizer(self) -> Any:
        """A ``transformers.PreTrainedTokenizerFast`` with its chat template set."""

    @abstractmethod
    def iter_weights(self, dtype: torch.dtype) -> Iterator[tuple[str, torch.Tensor]]:
        """Yield (HF parameter name, tensor) pairs, dequantized to ``dtype``."""

    def generation_config(self) -> dict[str, Any]:
        """Sampling defaults stored in the checkpoint (default: none)."""
        return {}
