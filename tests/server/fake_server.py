"""Run ``engine serve`` with the stand-in engine: ``python fake_server.py TOKENIZER_DIR FLAGS``.

Everything but the engine is the real server (flags, app, uvicorn, SIGTERM drain).
"""

from __future__ import annotations

import json
import os
import sys

from transformers import AutoTokenizer

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from engine.cli.serve import serve_main  # noqa: E402
from engine.testing.fake_client import FakeEngineClient, FakeEngineConfig  # noqa: E402


def main() -> int:
    tokenizer_dir, *argv = sys.argv[1:]
    overrides = json.loads(os.environ.get("FAKE_ENGINE_CONFIG", "{}"))
    config = FakeEngineConfig(**overrides)
    tokenizer = AutoTokenizer.from_pretrained(tokenizer_dir)
    return serve_main(argv, engine_factory=lambda args: FakeEngineClient(tokenizer, config))


if __name__ == "__main__":
    sys.exit(main())
