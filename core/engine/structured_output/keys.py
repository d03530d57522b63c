"""The cache key of a constraint: its kind and a canonical text of its spec.

Two requests asking for the same constraint written differently (dict key order, a schema
given as a dict or as a JSON string) share one compiled grammar. The spec handed to the
backend is the canonical one.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

from engine.errors import RequestValidationError
from engine.sampling_params import StructuredOutputsParams


@dataclass(frozen=True)
class GrammarKey:
    kind: str  # json | regex | choice | grammar | json_object
    canonical: str

    def backend_spec(self) -> Any:
        """The spec passed to ``StructuredOutputBackend.compile``."""
        if self.kind == "choice":
            return json.loads(self.canonical)
        if self.kind == "json_object":
            return True
        return self.canonical

    def num_bytes(self) -> int:
        return len(self.canonical.encode("utf-8")) + len(self.kind)


def _invalid(kind: str, reason: str) -> RequestValidationError:
    return RequestValidationError(f"structured_outputs.{kind}: {reason}")


def _canonical_json(kind: str, value: Any) -> str:
    try:
        return json.dumps(value, sort_keys=True, separators=(",", ":"), ensure_ascii=False)
    except (TypeError, ValueError) as exc:
        raise _invalid(kind, f"is not JSON-serialisable ({exc})") from exc
    except RecursionError:
        raise _invalid(kind, "nests too deeply; flatten it") from None


def _canonical(kind: str, spec: Any) -> str:
    if kind == "json":
        if isinstance(spec, str):
            try:
                spec = json.loads(spec)
            except RecursionError:
                raise _invalid(kind, "the JSON schema nests too deeply; flatten it") from None
            except json.JSONDecodeError as exc:
                raise _invalid(kind, f"the JSON schema is not valid JSON: {exc}") from exc
        if not isinstance(spec, dict | bool):
            raise _invalid(kind, f"a JSON schema must be an object, got {type(spec).__name__}")
        return _canonical_json(kind, spec)
    if kind == "choice":
        if not isinstance(spec, list | tuple) or not spec:
            raise _invalid(kind, "must be a non-empty list of strings")
        if not all(isinstance(c, str) for c in spec):
            raise _invalid(kind, "every choice must be a string")
        return _canonical_json(kind, list(spec))
    if kind in ("regex", "grammar"):
        if not isinstance(spec, str):
            raise _invalid(kind, f"must be a string, got {type(spec).__name__}")
        return spec
    if kind == "json_object":
        return ""
    raise _invalid(kind, "unknown kind; use json, regex, choice, grammar or json_object")


def grammar_key(params: StructuredOutputsParams, max_spec_chars: int) -> GrammarKey:
    """The key of ``params``; ``RequestValidationError`` for a malformed or oversized spec."""
    try:
        kind, spec = params.kind_and_spec()
    except ValueError as exc:
        raise RequestValidationError(str(exc)) from exc
    canonical = _canonical(kind, spec)
    if len(canonical) > max_spec_chars:
        raise _invalid(
            kind,
            f"is {len(canonical)} characters long, over the limit of {max_spec_chars}; "
            "shorten it (or raise structured_outputs_config.max_spec_chars)",
        )
    return GrammarKey(kind, canonical)
