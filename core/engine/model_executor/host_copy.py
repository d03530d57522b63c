"""Device-to-host copies that the host waits for only when it reads them.

A plain ``tensor.cpu()`` synchronises the whole stream, so with a next step already
queued behind this one it would wait for that step too. Here each tensor is copied with
``non_blocking=True`` (PyTorch puts the destination in pinned memory) and one CUDA event
marks the end of the copies; ``wait()`` blocks on that event alone. On the CPU the tensors
are already on the host.
"""

from __future__ import annotations

import torch


class HostCopy:
    def __init__(self, tensors: list[torch.Tensor]) -> None:
        self._event: torch.cuda.Event | None = None
        if any(t.device.type == "cuda" for t in tensors):
            self._tensors = [t.to("cpu", non_blocking=True) for t in tensors]
            self._event = torch.cuda.Event()
            self._event.record()
        else:
            self._tensors = [t.to("cpu") for t in tensors]

    def wait(self) -> list[torch.Tensor]:
        """The host tensors, once the copies are done."""
        if self._event is not None:
            self._event.synchronize()
            self._event = None
        return self._tensors
