"""The adapters a server serves by name: ``--lora-modules`` and runtime loads and unloads.

Clients pick an adapter with the request's ``model`` field; the base model keeps its own
names. Each load gets a new ``lora_int_id`` (so a reloaded name never shares prefix-cache
blocks with its previous weights). An adapter is counted in use from a request's start to
its end; unloading one in use is refused (the requests keep running on it), so an unload
never changes what a running request computes.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass
from pathlib import Path
from types import SimpleNamespace
from typing import Any

from engine.lora.adapter import LoRAAdapterError, check_adapter
from engine.lora.request import LoRARequest

__all__ = [
    "AdapterInUseError",
    "LoRAModule",
    "LoRARegistry",
    "UnknownAdapterError",
    "parse_lora_modules",
    "read_hf_config",
]


class UnknownAdapterError(LookupError):
    pass


class AdapterInUseError(RuntimeError):
    pass


@dataclass(frozen=True)
class LoRAModule:
    name: str
    path: str
    base_model_name: str | None = None


def parse_lora_modules(values: list[str]) -> list[LoRAModule]:
    """``name=path`` or ``{"name": ..., "path": ..., "base_model_name": ...}`` each."""
    modules = []
    for value in values:
        text = value.strip()
        if text.startswith("{"):
            try:
                data = json.loads(text)
            except json.JSONDecodeError as exc:
                message = f"--lora-modules: {text!r} is not valid JSON ({exc})"
                raise LoRAAdapterError(message) from None
            if not isinstance(data, dict) or not data.get("name") or not data.get("path"):
                raise LoRAAdapterError(
                    f'--lora-modules: {text!r} needs "name" and "path" ({{"name": "sql", '
                    '"path": "/adapters/sql", "base_model_name": "..."}})'
                )
            base = data.get("base_model_name")
            modules.append(LoRAModule(str(data["name"]), str(data["path"]), base and str(base)))
            continue
        name, sep, path = text.partition("=")
        if not sep or not name or not path:
            raise LoRAAdapterError(
                f"--lora-modules: {text!r} is not name=path (e.g. sql=/adapters/sql) or a "
                "JSON object"
            )
        modules.append(LoRAModule(name, path))
    return modules


def read_hf_config(model: str | None) -> Any | None:
    """The model folder's ``config.json`` as attributes (None: not a folder with one, as a
    GGUF file; adapters are then checked without their shapes)."""
    if not model:
        return None
    path = Path(model) / "config.json"
    if not path.is_file():
        return None
    data = json.loads(path.read_text())
    data = {**data, **data.get("text_config", {})}  # multimodal: the language model's
    return SimpleNamespace(**data)


class LoRARegistry:
    def __init__(
        self,
        max_lora_rank: int,
        hf_config: Any | None,
        base_model_names: list[str],
        lora_root: str | None = None,
    ) -> None:
        self.max_lora_rank = max_lora_rank
        self.hf_config = hf_config
        self.base_model_names = list(base_model_names)
        self.lora_root = lora_root
        self._adapters: dict[str, LoRARequest] = {}
        self._parents: dict[str, str] = {}
        self._in_use: dict[int, int] = {}  # lora_int_id -> running requests
        self._next_id = 1

    def names(self) -> list[str]:
        return list(self._adapters)

    def parent(self, name: str) -> str:
        return self._parents.get(name, self.base_model_names[0])

    def get(self, name: str) -> LoRARequest | None:
        return self._adapters.get(name)

    def add(self, module: LoRAModule, runtime: bool = False) -> LoRARequest:
        """Check and register an adapter; ``LoRAAdapterError`` says what is wrong."""
        if module.name in self.base_model_names:
            raise LoRAAdapterError(
                f"LoRA adapter name {module.name!r} is the base model's name; pick another"
            )
        if module.name in self._adapters:
            raise LoRAAdapterError(
                f"LoRA adapter {module.name!r} is already loaded; unload it first or pick "
                "another name"
            )
        path = module.path
        if runtime:
            path = self._check_runtime_path(module)
        request = LoRARequest(module.name, self._next_id, path, module.base_model_name)
        check_adapter(request, self.max_lora_rank, self.hf_config)
        self._next_id += 1
        self._adapters[module.name] = request
        self._parents[module.name] = module.base_model_name or self.base_model_names[0]
        return request

    def _check_runtime_path(self, module: LoRAModule) -> str:
        if self.lora_root is None:
            raise LoRAAdapterError(
                "runtime LoRA loading needs --lora-root (the folder adapters may be loaded "
                "from); restart the server with it"
            )
        if "://" in module.path:
            raise LoRAAdapterError(
                f"lora_path {module.path!r} is not a local folder; only folders under "
                f"--lora-root ({self.lora_root}) are loaded"
            )
        root = Path(os.path.realpath(self.lora_root))
        path = Path(os.path.realpath(module.path))
        if path != root and root not in path.parents:
            raise LoRAAdapterError(
                f"lora_path {module.path!r} is outside --lora-root ({self.lora_root}); put "
                "the adapter under that folder"
            )
        return str(path)

    def remove(self, name: str) -> LoRARequest:
        request = self._adapters.get(name)
        if request is None:
            loaded = ", ".join(self._adapters) or "none"
            raise UnknownAdapterError(f"LoRA adapter {name!r} is not loaded; loaded: {loaded}")
        running = self._in_use.get(request.lora_int_id, 0)
        if running:
            raise AdapterInUseError(
                f"LoRA adapter {name!r} is in use by {running} running request(s); retry "
                "the unload once they finish"
            )
        del self._adapters[name]
        self._parents.pop(name, None)
        return request

    def acquire(self, request: LoRARequest) -> None:
        self._in_use[request.lora_int_id] = self._in_use.get(request.lora_int_id, 0) + 1

    def release(self, request: LoRARequest) -> None:
        count = self._in_use.get(request.lora_int_id, 0) - 1
        if count > 0:
            self._in_use[request.lora_int_id] = count
        else:
            self._in_use.pop(request.lora_int_id, None)


def build_lora_registry(engine_args: Any, server_args: Any, served_names: list[str]) -> Any:
    """The server's registry with ``--lora-modules`` loaded (None without --enable-lora);
    ``LoRAAdapterError`` for a bad flag or adapter."""
    if not engine_args.enable_lora:
        if server_args.lora_modules or server_args.allow_runtime_lora_updating:
            raise LoRAAdapterError(
                "--lora-modules and --allow-runtime-lora-updating need --enable-lora"
            )
        if engine_args.lora_merge_single_adapter:
            raise LoRAAdapterError("--lora-merge-single-adapter needs --enable-lora")
        return None
    if server_args.allow_runtime_lora_updating and server_args.lora_root is None:
        raise LoRAAdapterError(
            "--allow-runtime-lora-updating needs --lora-root (the folder adapters may be "
            "loaded from)"
        )
    registry = LoRARegistry(
        engine_args.max_lora_rank,
        read_hf_config(engine_args.model),
        served_names,
        server_args.lora_root,
    )
    for module in parse_lora_modules(server_args.lora_modules):
        registry.add(module)
    return registry
