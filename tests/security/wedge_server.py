"""``engine serve`` with the real engine, except that a step hangs for good once a request
whose id starts with ``wedge`` is in flight: ``python wedge_server.py SERVE_FLAGS``.

The patch is made at import, so the engine process (spawned: it imports this module as
``__mp_main__``) hangs too, not only an in-process engine thread."""

from __future__ import annotations

import sys
import time

from engine.cli.serve import serve_main
from engine.llm_engine import LLMEngine

_real_step = LLMEngine.step


def wedging_step(self: LLMEngine) -> object:
    if any(i.startswith("wedge") for i in self.output_processor.all_request_ids()):
        while True:  # a wedged kernel or a deadlock: the loop never comes back
            time.sleep(1)
    return _real_step(self)


LLMEngine.step = wedging_step  # type: ignore[method-assign]

if __name__ == "__main__":
    sys.exit(serve_main(sys.argv[1:]))
