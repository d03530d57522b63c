"""Child processes of the engine (the engine process, tensor-parallel workers) exit when
their parent dies, even when the parent was SIGKILLed and even while the child is busy or
wedged and reads nothing from its pipe."""

from __future__ import annotations

import os
import threading
import time

__all__ = ["exit_with_parent"]


def exit_with_parent(parent_pid: int, name: str, poll_s: float = 1.0) -> None:
    """Start a daemon thread that ends this process once ``parent_pid`` is no longer its
    parent (the parent died and the process was re-parented)."""

    def watch() -> None:
        while True:
            time.sleep(poll_s)
            if os.getppid() != parent_pid:
                os._exit(1)

    threading.Thread(target=watch, name=name, daemon=True).start()
