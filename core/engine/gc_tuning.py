"""The garbage collector's settings for a process that runs an engine or its front end.

Two changes from CPython's defaults, both after startup:

- ``gc.freeze()``: the startup objects (weights' Python wrappers, tokenizer tables) live
  for the whole run; frozen, they leave the collector's generations, so full collections
  during serving stay short (measured: pauses up to 170 ms a step without it).
- The young generation's threshold from 700 to ``GEN0_THRESHOLD``: a decode step at batch
  256 holds well over 700 new container objects at once (a core output, a request output
  and their lists per request, freed by the next step), so the collector ran on every
  step without finding garbage: 0.6 ms of the host's 3.4 ms a step at 256 requests x 1,024
  output tokens, 0 at 20,000 (``benchmarks/host_overhead.py --gc-freeze``, dev CPU,
  2026-12-06). Reference cycles are still collected, after 20,000 net new objects.

A threshold the program set above 700 itself, or 0 (collection off), is left alone.
"""

from __future__ import annotations

import gc

GEN0_THRESHOLD = 20_000
_CPYTHON_GEN0_DEFAULT = 700


def settle_after_startup() -> None:
    """Collect and freeze the startup objects; raise a default young-generation threshold."""
    gc.collect()
    gc.freeze()
    first, *rest = gc.get_threshold()
    if 0 < first <= _CPYTHON_GEN0_DEFAULT:
        gc.set_threshold(GEN0_THRESHOLD, *rest)
