"""Runtime LoRA routes (vLLM's): ``POST /v1/load_lora_adapter`` and ``/v1/unload_lora_adapter``.

Only with ``--allow-runtime-lora-updating``, behind the API key like every route, and only
for local folders under ``--lora-root``. A load is checked completely before the name is
served (folder, files, rank against ``--max-lora-rank``, targets, shapes against the model:
400 naming what to change); an unload of an adapter with running requests is refused (409),
so it never changes what a running request computes.
"""

from __future__ import annotations

from fastapi import APIRouter
from fastapi.responses import PlainTextResponse
from pydantic import BaseModel, ConfigDict

from engine.entrypoints.openai.errors import APIError
from engine.entrypoints.openai.serving_base import ServingContext
from engine.lora.adapter import LoRAAdapterError
from engine.lora.registry import (
    AdapterInUseError,
    LoRAModule,
    LoRARegistry,
    UnknownAdapterError,
)

__all__ = ["LoadLoRAAdapterRequest", "UnloadLoRAAdapterRequest", "add_lora_routes"]


class LoadLoRAAdapterRequest(BaseModel):
    model_config = ConfigDict(extra="forbid")
    lora_name: str
    lora_path: str
    base_model_name: str | None = None


class UnloadLoRAAdapterRequest(BaseModel):
    model_config = ConfigDict(extra="forbid")
    lora_name: str
    lora_int_id: int | None = None


def add_lora_routes(router: APIRouter, ctx: ServingContext) -> None:
    @router.post("/v1/load_lora_adapter", response_class=PlainTextResponse)
    async def load_lora_adapter(body: LoadLoRAAdapterRequest) -> str:
        registry = _registry(ctx)
        if body.lora_name in ctx.served_model_names:
            raise APIError(
                f"lora_name {body.lora_name!r} is the base model's name; pick another",
                400,
                "lora_name",
            )
        module = LoRAModule(body.lora_name, body.lora_path, body.base_model_name)
        try:
            registry.add(module, runtime=True)
        except LoRAAdapterError as exc:
            raise APIError(str(exc), 400, "lora_path", "invalid_lora_adapter") from None
        return f"Success: LoRA adapter '{body.lora_name}' added successfully."

    @router.post("/v1/unload_lora_adapter", response_class=PlainTextResponse)
    async def unload_lora_adapter(body: UnloadLoRAAdapterRequest) -> str:
        registry = _registry(ctx)
        loaded = registry.get(body.lora_name)
        if loaded is not None and body.lora_int_id not in (None, loaded.lora_int_id):
            raise APIError(
                f"LoRA adapter {body.lora_name!r} is loaded with id {loaded.lora_int_id}, not "
                f"{body.lora_int_id}",
                404,
                "lora_int_id",
            )
        try:
            registry.remove(body.lora_name)
        except UnknownAdapterError as exc:
            raise APIError(str(exc), 404, "lora_name", "lora_adapter_not_found") from None
        except AdapterInUseError as exc:
            raise APIError(str(exc), 409, "lora_name", "lora_adapter_in_use") from None
        return f"Success: LoRA adapter '{body.lora_name}' removed successfully."


def _registry(ctx: ServingContext) -> LoRARegistry:
    if ctx.lora is None:
        raise APIError("LoRA is off on this server: start it with --enable-lora", 400)
    return ctx.lora
