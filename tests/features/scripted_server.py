"""Run ``engine serve`` over the scripted engine:
``python scripted_server.py TOKENIZER_DIR SERVE_ARGS...`` with ``SCRIPTS`` (a JSON list of
outputs) in the environment. A request's ``seed`` picks its script (none: the first), so
one server answers every case of a test module through the real HTTP stack.
"""

from __future__ import annotations

import json
import os
import sys

from engine.cli.serve import serve_main
from engine.testing.fake_client import FakeEngineClient, FakeEngineConfig
from transformers import AutoTokenizer


def main() -> int:
    tokenizer_dir, *argv = sys.argv[1:]
    scripts = json.loads(os.environ["SCRIPTS"])
    chunk_size = int(os.environ.get("SCRIPT_CHUNK_SIZE", "3"))
    tokenizer = AutoTokenizer.from_pretrained(tokenizer_dir)
    config = FakeEngineConfig(
        scripts=scripts, chunk_size=chunk_size, step_s=0.0, max_running=64, max_queued=64,
        max_model_len=8192,  # tool schemas in the prompt: about a token a character
        sampling_defaults={"temperature": 0.0},
    )  # fmt: skip
    return serve_main(argv, engine_factory=lambda args: FakeEngineClient(tokenizer, config))


if __name__ == "__main__":
    sys.exit(main())
