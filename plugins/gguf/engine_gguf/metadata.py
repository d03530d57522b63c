"""Reading a GGUF file's key-value metadata and tensor table (one ``gguf.GGUFReader``)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import gguf


class GGUFFile:
    """A parsed GGUF file: typed metadata lookups and the tensor list.

    The reader memory-maps the file; tensor data is read only when dequantized.
    """

    def __init__(self, path: Path) -> None:
        self.path = path
        try:
            self.reader = gguf.GGUFReader(str(path))
        except (ValueError, OSError, IndexError, KeyError) as e:  # truncated or not GGUF
            raise ValueError(f"cannot read {path} as a GGUF file: {e}") from e
        self.tensors: dict[str, gguf.ReaderTensor] = {t.name: t for t in self.reader.tensors}
        self.architecture: str = self.get_str("general.architecture")

    def has(self, key: str) -> bool:
        """Whether the metadata holds ``key``."""
        return key in self.reader.fields

    def get(self, key: str, default: Any = None) -> Any:
        """The value of ``key`` (str, number, bool or list), or ``default`` when absent."""
        field = self.reader.fields.get(key)
        if field is None:
            return default
        return field.contents()

    def get_str(self, key: str) -> str:
        """A required string value; the error names the missing key."""
        value = self.get(key)
        if not isinstance(value, str):
            raise ValueError(f"GGUF file {self.path} has no string metadata {key!r}")
        return value

    def arch_key(self, suffix: str) -> str:
        """``suffix`` under the architecture prefix (``llama.block_count``)."""
        return f"{self.architecture}.{suffix}"

    def get_arch(self, suffix: str, default: Any = None) -> Any:
        """The value of ``{architecture}.{suffix}``, or ``default``."""
        return self.get(self.arch_key(suffix), default)

    def require_arch(self, suffix: str) -> Any:
        """A required ``{architecture}.{suffix}`` value; the error names the key."""
        value = self.get_arch(suffix)
        if value is None:
            raise ValueError(
                f"GGUF file {self.path} lacks metadata {self.arch_key(suffix)!r}; "
                "re-convert it with a recent llama.cpp convert_hf_to_gguf.py"
            )
        return value

    def array_len(self, key: str) -> int | None:
        """Number of items of the array ``key`` without decoding them (None when absent)."""
        field = self.reader.fields.get(key)
        return None if field is None else len(field.data)

    def torch_shape(self, name: str) -> tuple[int, ...]:
        """Tensor ``name``'s shape in torch order (GGUF stores dimensions reversed)."""
        return tuple(int(d) for d in reversed(self.tensors[name].shape.tolist()))
