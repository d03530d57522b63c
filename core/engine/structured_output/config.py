"""``StructuredOutputsConfig``: which grammar backend, and the bounds on compiling."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class StructuredOutputsConfig:
    """Settings of the ``StructuredOutputManager`` (``--structured-outputs-config.*``).

    - ``backend``: a ``structured_output_backend`` plugin name, or ``auto`` (highest
      priority installed).
    - ``compile_timeout_s``: a constraint not compiled by then fails its request with a
      400; counted from submission, so time queued behind other compiles counts too. A
      compile running that long in its worker gets the worker killed (and replaced).
    - ``compile_memory_bytes``: address space a compile may use on top of its worker's
      baseline (``RLIMIT_AS``); a compile needing more fails with a 400 and its worker is
      replaced.
    - ``max_cache_entries`` / ``max_cache_bytes``: the in-memory LRU cache of compiled
      grammars (no disk cache); the byte count uses each grammar's ``num_bytes`` estimate.
    - ``num_compile_workers``: compile worker processes; at most this many compiles run
      at once.
    - ``max_spec_chars``: longest accepted schema / regex / choice list / grammar text.
    - ``max_repeat``: largest repetition count (regex ``{m,n}``, schema ``maxLength``,
      ``maxItems``, ...), multiplied along nesting (``bounds.py``).
    - ``max_schema_depth``: deepest nesting of a JSON schema's objects and arrays.
    """

    backend: str = "auto"
    compile_timeout_s: float = 30.0
    compile_memory_bytes: int = 4 << 30
    max_cache_entries: int = 256
    max_cache_bytes: int = 512 << 20
    num_compile_workers: int = 2
    max_spec_chars: int = 64 << 10
    max_repeat: int = 1024
    max_schema_depth: int = 64

    def __post_init__(self) -> None:
        checks = {
            "compile_timeout_s": self.compile_timeout_s > 0,
            "compile_memory_bytes": self.compile_memory_bytes >= 16 << 20,
            "max_cache_entries": self.max_cache_entries >= 0,
            "max_cache_bytes": self.max_cache_bytes >= 0,
            "num_compile_workers": self.num_compile_workers >= 1,
            "max_spec_chars": self.max_spec_chars >= 1,
            "max_repeat": self.max_repeat >= 1,
            "max_schema_depth": self.max_schema_depth >= 1,
        }
        for name, ok in checks.items():
            if not ok:
                raise ValueError(
                    f"structured_outputs_config.{name} is out of range: "
                    f"{getattr(self, name)!r} (timeouts and workers must be positive, "
                    "sizes non-negative, compile_memory_bytes at least 16 MiB)"
                )
