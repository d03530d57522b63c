"""engine-gguf: load GGUF checkpoints (llama.cpp's format) into Engine.

The entry point is ``engine_gguf.plugin``; the loader itself is
``engine_gguf.format:GGUFFormat``, imported only when the engine opens a ``.gguf`` model.
Nothing here imports torch or gguf at import time.
"""

from __future__ import annotations

__version__ = "0.1.0"
