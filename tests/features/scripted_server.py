"""Run ``engine serve`` over the scripted engine:
``python scripted_server.py TOKENIZER_DIR SERVE_ARGS...`` with ``SCRIPTS`` (a JSON list of
outputs) in the environment. A request's ``seed`` picks its script (none: the first), so
one server answers every case of a test module through the real HTTP stack.
"""

from __future__ import annotations

import json
import os
import sys
from collections.abc import AsyncIterator
from typing import Any

from transformers import AutoTokenizer

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from engine.cli.serve import serve_main  # noqa: E402
from engine.outputs import RequestOutput  # noqa: E402
from engine.sampling_params import SamplingParams  # noqa: E402
from scripted_engine import ScriptedAsyncLLM  # noqa: E402


class SeededScripts(ScriptedAsyncLLM):
    def __init__(self, tokenizer: Any, scripts: list[str], chunk_size: int) -> None:
        super().__init__(tokenizer, scripts[0], chunk_size)
        self.scripts = scripts
        self.max_model_len = 8192  # tool schemas in the prompt: about a token a character

    async def generate(
        self, prompt: Any, params: SamplingParams, request_id: str, priority: int = 0,
        cache_salt: str | None = None,
    ) -> AsyncIterator[RequestOutput]:  # fmt: skip
        self.script = self.scripts[params.seed or 0]
        async for out in super().generate(prompt, params, request_id, priority, cache_salt):
            yield out


def main() -> int:
    tokenizer_dir, *argv = sys.argv[1:]
    scripts = json.loads(os.environ["SCRIPTS"])
    chunk_size = int(os.environ.get("SCRIPT_CHUNK_SIZE", "3"))
    tokenizer = AutoTokenizer.from_pretrained(tokenizer_dir)
    return serve_main(
        argv, engine_factory=lambda args: SeededScripts(tokenizer, scripts, chunk_size)
    )


if __name__ == "__main__":
    sys.exit(main())
