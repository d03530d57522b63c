"""Where a model comes from: an HF folder or a format plugin's file (GGUF), behind one API.

``open_model_source(args, pm)`` asks each format plugin whether it claims ``--model``
first, then falls back to the Hugging Face folder layout (config.json, tokenizer files,
``model.safetensors`` or shards with ``model.safetensors.index.json``, optional
generation_config.json). Every problem is a ``StartupError`` that names the path.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any

from engine_sdk.specs import ModelFormatSpec

from engine.errors import StartupError

if TYPE_CHECKING:
    import torch
    from engine_sdk.interfaces.model_format import ModelFormat

    from engine.config import EngineArgs
    from engine.plugins import PluginManager

logger = logging.getLogger(__name__)

__all__ = ["FormatModelSource", "HFFolderSource", "ModelSource", "open_model_source"]

_SAFETENSORS_INDEX = "model.safetensors.index.json"
_TORCH_BIN_INDEX = "pytorch_model.bin.index.json"


class ModelSource:
    """Config, tokenizer, weights and sampling defaults of one checkpoint."""

    path: Path
    hf_config: Any

    def __init__(self, path: Path, args: EngineArgs) -> None:
        self.path = path
        self.args = args

    def load_tokenizer(self) -> Any:
        raise NotImplementedError

    def iter_weights(self, dtype: torch.dtype | None = None) -> Iterator[tuple[str, torch.Tensor]]:
        raise NotImplementedError

    def generation_config(self) -> dict[str, Any]:
        raise NotImplementedError

    def has_weights(self) -> bool:
        """Whether checkpoint tensors exist (``--load-format dummy`` needs none)."""
        return True

    def _apply_chat_template_override(self, tokenizer: Any) -> Any:
        template = self.args.chat_template
        if template:
            tokenizer.chat_template = read_chat_template(template)
        return tokenizer


def read_chat_template(value: str) -> str:
    """``--chat-template``: a file path, or an inline Jinja template."""
    candidate = Path(value).expanduser()
    if "{" not in value and "\n" not in value:
        try:
            return candidate.read_text(encoding="utf-8")
        except OSError as exc:
            raise StartupError(
                f"--chat-template {value!r} is neither a readable file ({exc.strerror}) nor an "
                "inline Jinja template; pass an existing file or the template text"
            ) from None
    return value


class HFFolderSource(ModelSource):
    """A Hugging Face checkpoint folder."""

    def __init__(self, path: Path, args: EngineArgs) -> None:
        super().__init__(path, args)
        self.hf_config = self._load_config()

    def _load_config(self) -> Any:
        from transformers import AutoConfig

        try:
            return AutoConfig.from_pretrained(
                str(self.path), trust_remote_code=self.args.trust_remote_code
            )
        except Exception as exc:  # transformers raises ValueError, OSError, KeyError...
            hint = "" if self.args.trust_remote_code else " (custom code needs --trust-remote-code)"
            raise StartupError(f"cannot read {self.path / 'config.json'}: {exc}{hint}") from exc

    def load_tokenizer(self) -> Any:
        from transformers import AutoTokenizer

        path = Path(self.args.tokenizer).expanduser() if self.args.tokenizer else self.path
        try:
            tokenizer = AutoTokenizer.from_pretrained(
                str(path), trust_remote_code=self.args.trust_remote_code
            )
        except Exception as exc:
            raise StartupError(
                f"cannot load a tokenizer from {path}: {exc}. Put tokenizer.json / "
                "tokenizer_config.json there or pass --tokenizer FOLDER"
            ) from exc
        return self._apply_chat_template_override(tokenizer)

    def weight_files(self) -> list[Path]:
        """The checkpoint's tensor files, in a stable order."""
        for index_name in (_SAFETENSORS_INDEX, _TORCH_BIN_INDEX):
            index_file = self.path / index_name
            if index_file.is_file():
                weight_map = json.loads(index_file.read_text())["weight_map"]
                files = [self.path / name for name in sorted(set(weight_map.values()))]
                missing = [str(f.name) for f in files if not f.is_file()]
                if missing:
                    raise StartupError(
                        f"{index_file} lists shard(s) that are missing: {', '.join(missing)}; "
                        "re-download the checkpoint"
                    )
                return files
        for single in ("model.safetensors", "pytorch_model.bin"):
            if (self.path / single).is_file():
                return [self.path / single]
        files = sorted(self.path.glob("*.safetensors"))
        if files:
            return files
        raise StartupError(
            f"no weights in {self.path}: expected model.safetensors, shards with "
            f"{_SAFETENSORS_INDEX}, or pytorch_model.bin; use --load-format dummy to run "
            "with random weights"
        )

    def has_weights(self) -> bool:
        try:
            self.weight_files()
        except StartupError:
            return False
        return True

    def iter_weights(self, dtype: torch.dtype | None = None) -> Iterator[tuple[str, torch.Tensor]]:
        """Yield (HF name, tensor) as stored; the model's copy converts to its dtype.

        ``dtype`` is accepted for parity with format plugins (which dequantize to it);
        tensors here are not converted, so float32 quantization scales keep full precision.
        """
        for file in self.weight_files():
            if file.suffix == ".safetensors":
                from safetensors import safe_open

                with safe_open(str(file), framework="pt") as f:
                    for name in f.keys():  # noqa: SIM118 - safe_open has no __iter__
                        yield name, f.get_tensor(name)
            else:
                import torch

                state = torch.load(str(file), map_location="cpu", weights_only=True)
                yield from state.items()

    def generation_config(self) -> dict[str, Any]:
        setting = self.args.generation_config
        if setting == "vllm":
            return {}
        folder = self.path if setting == "auto" else Path(setting).expanduser()
        file = folder / "generation_config.json"
        if not file.is_file():
            if setting != "auto":
                raise StartupError(
                    f"--generation-config {setting!r}: {file} does not exist; pass 'auto', "
                    "'vllm' or a folder with generation_config.json"
                )
            return {}
        try:
            loaded: dict[str, Any] = json.loads(file.read_text())
        except json.JSONDecodeError as exc:
            raise StartupError(f"{file} is not valid JSON: {exc}") from exc
        return loaded


class FormatModelSource(ModelSource):
    """A checkpoint read by a format plugin (``ModelFormat``)."""

    def __init__(self, path: Path, args: EngineArgs, fmt: ModelFormat) -> None:
        super().__init__(path, args)
        self.format = fmt
        self.hf_config = fmt.load_config()

    def load_tokenizer(self) -> Any:
        return self._apply_chat_template_override(self.format.load_tokenizer())

    def iter_weights(self, dtype: torch.dtype | None = None) -> Iterator[tuple[str, torch.Tensor]]:
        import torch

        return self.format.iter_weights(dtype if dtype is not None else torch.float32)

    def generation_config(self) -> dict[str, Any]:
        if self.args.generation_config == "vllm":
            return {}
        return self.format.generation_config()


def _may_claim(spec: ModelFormatSpec, path: Path) -> bool:
    """Whether the spec's declared ``suffixes`` allow it to claim ``path`` (a file with one
    of them, or a folder holding one); a format that declares none is always asked."""
    suffixes = tuple(suffix.lower() for suffix in spec.suffixes)
    if not suffixes:
        return True
    if path.is_file():
        return path.name.lower().endswith(suffixes)
    return any(child.name.lower().endswith(suffixes) for child in path.iterdir())


def _claiming_format(path: Path, pm: PluginManager) -> type[ModelFormat] | None:
    """The first format plugin that claims ``path``.

    Declared suffixes filter without importing anything, so an HF folder never imports a
    GGUF loader. A format whose code fails to import is marked failed and skipped (another
    format or the HF layout may still read the path), unless ``path`` is a file only it
    would read: then its error is the answer.
    """
    from engine.plugins import PluginError

    for spec in pm.registry.specs("model_format"):
        if not isinstance(spec, ModelFormatSpec) or not _may_claim(spec, path):
            continue
        try:
            cls: type[ModelFormat] = pm.registry.resolve("model_format", spec.name)
        except PluginError as exc:
            if path.is_file():
                raise StartupError(f"cannot read {path}: {exc}") from exc
            try:
                pm.mark_failed("model_format", spec.name, str(exc))
            except PluginError as required:
                raise StartupError(str(required)) from exc
            continue
        if cls.claims(path):
            logger.info("model format plugin %r reads %s", spec.name, path)
            return cls
    return None


def open_model_source(args: EngineArgs, pm: PluginManager) -> ModelSource:
    """Open ``args.model``: a format plugin's file, else an HF folder."""
    if not args.model:
        raise StartupError("no model given: pass --model PATH (an HF folder or a GGUF file)")
    path = Path(args.model).expanduser()
    if not path.exists():
        raise StartupError(
            f"model path {path} does not exist; pass --model with a local folder holding "
            "config.json and *.safetensors (or a file a format plugin reads, such as .gguf)"
        )
    fmt_cls = _claiming_format(path, pm)
    if fmt_cls is not None:
        return FormatModelSource(path, args, fmt_cls(path))
    if path.is_file():
        formats = [s.name for s in pm.registry.specs("model_format")]
        raise StartupError(
            f"model path {path} is a file no format plugin reads (loaded formats: "
            f"{', '.join(formats) or 'none'}); pass an HF folder, or install the plugin for "
            "this format (`engine plugins list --available --kind model_format`)"
        )
    if not (path / "config.json").is_file():
        raise StartupError(
            f"{path} has no config.json; --model must be a Hugging Face checkpoint folder "
            "(config.json, tokenizer files, *.safetensors) or a file a format plugin reads"
        )
    return HFFolderSource(path, args)
