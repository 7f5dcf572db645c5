"""Wall-clock limits for tests: generous, scaled to this machine's speed now, and never what a test checks.

A limit in a test only keeps a hung subprocess from hanging CI. Speed is measured by benchmarks (``make bench``),
so a test must not fail because a shared 2-core machine is busy or an AVX2 CPU decodes in fp32. Every limit is
``generous(seconds)``: the seconds a run needs on the machine the tests were written on, times SLACK, times how
much slower this machine is right now at a fixed calibration workload (never less than 1), times
``SPECBENCH_TEST_TIME_SCALE`` (default 1; raise it on a machine slower than the calibration can tell). Waiting for
something a subprocess does (a record written) is ``wait_for``: it ends on the event or on the process's exit.
"""
from __future__ import annotations

import functools
import os
import statistics
import subprocess
import time
from typing import Callable

import torch

SLACK = 4.0
# calibration() on the machine the limits were written on (Intel Xeon, 2 vCPUs, AVX-512, load ~1.4): 0.024 s
REFERENCE_CALIBRATION_S = 0.025


def calibration() -> float:
    """Seconds for a fixed mix of interpreter work and small matmuls, what the tiny-model CLI runs consist of:
    the median of three tries."""
    a = torch.randn(64, 64, generator=torch.Generator().manual_seed(0))
    times = []
    for _ in range(3):
        start = time.perf_counter()
        total, x = 0, a
        for i in range(1000):
            x = torch.tanh(x @ a)
            total += sum(range(200)) + i
        times.append(time.perf_counter() - start)
    return statistics.median(times)


@functools.cache
def machine_factor() -> float:
    """How many times slower than the reference machine this one is now (>= 1), times SPECBENCH_TEST_TIME_SCALE."""
    scale = float(os.environ.get("SPECBENCH_TEST_TIME_SCALE", "1"))
    if not scale > 0:
        raise ValueError(f"SPECBENCH_TEST_TIME_SCALE must be a positive number, got {scale!r}")
    return max(1.0, calibration() / REFERENCE_CALIBRATION_S) * scale


def generous(seconds: float) -> float:
    """A limit for something that takes about ``seconds`` on the reference machine."""
    return seconds * SLACK * machine_factor()


def wait_for(condition: Callable[[], bool], proc: subprocess.Popen, what: str, seconds: float = 120,
             poll_s: float = 0.02) -> None:
    """Return once ``condition()`` holds; fail if ``proc`` ends first, or (a hang) after ``generous(seconds)``."""
    limit = generous(seconds)
    start = time.monotonic()
    while not condition():
        if proc.poll() is not None:
            if condition():
                return
            raise AssertionError(f"the process ended (exit {proc.returncode}) before {what}")
        if time.monotonic() - start > limit:
            raise AssertionError(f"{what}: not after {limit:.0f} s (a hang?)")
        time.sleep(poll_s)
