"""One log line format for every process of ``engine serve`` (the server, the engine
process, API server processes)."""

from __future__ import annotations

import logging
import sys

__all__ = ["configure_logging"]


def configure_logging(level: int, tag: str = "") -> None:
    """Log to stderr at ``level``; ``tag`` follows the logger name (``engine.server[1]``)."""
    logging.basicConfig(
        level=level,
        format=f"%(asctime)s %(levelname)s %(name)s{tag}: %(message)s",
        datefmt="%Y-%m-%d %H:%M:%S",
        stream=sys.stderr,
        force=True,
    )
