"""The runner's clock. Methods only mark phase ends on it; they never read time themselves."""
from __future__ import annotations

import time

import torch


class Stopwatch:
    """perf_counter timing with a CUDA synchronize at every reading when the device is a GPU.

    ``step()`` reads the clock each time a decoding step's tokens are committed, without a synchronize: on the CPU a
    perf_counter reading, on a GPU a CUDA event recorded on the stream, resolved once the generation stopped.
    ``steps_ms`` (after ``stop``): milliseconds from ``start`` to each step's end, in order — the clock a comparison
    over identical work reads at a given token (analysis/identical_work.py)."""

    def __init__(self, device: torch.device):
        self._cuda = torch.device(device).type == "cuda"
        self._sync = torch.cuda.synchronize if self._cuda else (lambda: None)
        self._t0 = 0.0
        self.marks: dict[str, float] = {}
        self.steps_ms: list[float] = []
        self._events: list = []  # CUDA: the start event, then one per step

    def start(self) -> None:
        self.marks, self.steps_ms, self._events = {}, [], []
        self._sync()
        if self._cuda:
            self._events.append(torch.cuda.Event(enable_timing=True))
            self._events[0].record()
        self._t0 = time.perf_counter()

    def step(self) -> None:
        if self._cuda:
            event = torch.cuda.Event(enable_timing=True)
            event.record()
            self._events.append(event)
        else:
            self.steps_ms.append(1000 * (time.perf_counter() - self._t0))

    def mark(self, event: str) -> None:
        """Seconds since start() at the end of a phase (e.g. "prefill"); the first mark of a name wins."""
        if event not in self.marks:
            self._sync()
            self.marks[event] = time.perf_counter() - self._t0

    def stop(self) -> float:
        self._sync()
        elapsed = time.perf_counter() - self._t0
        if self._events:  # resolved after the clock stopped: no synchronize inside the timed region
            start = self._events[0]
            self.steps_ms = [start.elapsed_time(event) for event in self._events[1:]]
        return elapsed


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
