"""Entry-point module of engine-outlines: declares the backend, imports none of it."""

from __future__ import annotations

from engine_sdk import StructuredOutputBackendSpec, hookimpl


@hookimpl
def register_structured_output_backends() -> list[StructuredOutputBackendSpec]:
    return [
        StructuredOutputBackendSpec(
            name="outlines",
            target="engine_outlines.backend:OutlinesBackend",
            description="JSON schema, regex, choice and json_object via outlines-core",
            priority=10,
        )
    ]
