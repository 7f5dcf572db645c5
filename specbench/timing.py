"""The runner's clock. Methods only mark phase ends on it; they never read time themselves."""
from __future__ import annotations

import time

import torch


class Stopwatch:
    """perf_counter timing with a CUDA synchronize at every reading when the device is a GPU."""

    def __init__(self, device: torch.device):
        self._sync = torch.cuda.synchronize if device.type == "cuda" else (lambda: None)
        self._t0 = 0.0
        self.marks: dict[str, float] = {}

    def start(self) -> None:
        self.marks = {}
        self._sync()
        self._t0 = time.perf_counter()

    def mark(self, event: str) -> None:
        """Seconds since start() at the end of a phase (e.g. "prefill"); the first mark of a name wins."""
        if event not in self.marks:
            self._sync()
            self.marks[event] = time.perf_counter() - self._t0

    def stop(self) -> float:
        self._sync()
        return time.perf_counter() - self._t0
