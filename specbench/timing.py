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


class ForwardClock:
    """Wall milliseconds of each model forward (``ms``, in call order), read around the call by the wrapper that runs
    it (CachedLM, StaticLM, LlamaCppLM): the harness's clock, never a method's. Records keep them (``forward_ms``) so
    an efficiency below 1 splits into forwards that ran slower than their cost table and host work between forwards
    (costs.forward_split). Kept only where a forward has finished when it returns (the CPU, llama.cpp): on a GPU a
    reading per forward would need a synchronize, which changes what is measured, so ``ms`` stays empty there."""

    def __init__(self, device: torch.device):
        self.kept = torch.device(device).type == "cpu"
        self.ms: list[float] = []
        self._t0 = 0.0

    def reset(self) -> None:
        self.ms = []

    def start(self) -> None:
        self._t0 = time.perf_counter()

    def stop(self) -> None:
        if self.kept:
            self.ms.append(1000 * (time.perf_counter() - self._t0))
