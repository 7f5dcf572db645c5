"""Counting a generation's device-to-host reads: on a GPU each is a host sync (the loop waits for every kernel
queued before it), so a step that reads more than once measures our loop as much as the method (issue 53's
target: one per decoding step). ``count_host_reads()`` counts, for its duration, every Python-level read of a
tensor's values (``tolist``, ``item``, ``int()``, ``float()``, ``bool()``, use as an index, ``cpu``, ``numpy``) by
where it was called from, except ``host_value``'s (values the host makes itself: the sampler's uniforms). On a CPU
every tensor is a host tensor, so it counts the reads a GPU run of the same code makes; on CUDA,
``torch.cuda.set_sync_debug_mode("warn")`` names the same places. Copies from the host (an index tensor built from
Python ids) are not counted: the decoding code stages them through pinned memory without blocking (staging.py).
"""
from __future__ import annotations

import sys
import warnings
from collections import Counter
from contextlib import contextmanager

import torch

READS = ("tolist", "item", "__int__", "__float__", "__bool__", "__index__", "cpu", "numpy")
_item = torch.Tensor.item  # before any counting: host_value's read is never counted


def host_value(tensor: torch.Tensor):
    """The value of a one-element tensor made on the host whatever device the models run on (the sampler's uniforms,
    drawn from its CPU generator): not a device read on any machine, so ``count_host_reads`` does not count it."""
    if tensor.device.type != "cpu":
        raise ValueError(f"host_value reads host tensors only, got one on {tensor.device}")
    return _item(tensor)


@contextmanager
def count_host_reads():
    """Yields a Counter of reads keyed by (read, "file:line" of the code that asked); ``sum(c.values())`` in all."""
    counter: Counter = Counter()
    originals = {name: getattr(torch.Tensor, name) for name in READS}

    def counting(name):
        original = originals[name]

        def read(self, *args, **kwargs):
            caller = sys._getframe(1)
            counter[(name, f"{caller.f_code.co_filename.rsplit('/specbench/', 1)[-1]}:{caller.f_lineno}")] += 1
            return original(self, *args, **kwargs)

        return read

    for name in READS:
        setattr(torch.Tensor, name, counting(name))
    try:
        yield counter
    finally:
        for name, original in originals.items():
            setattr(torch.Tensor, name, original)


@contextmanager
def cuda_syncs(device):
    """Yields a list that, on CUDA, collects torch's warning for every synchronizing operation the block makes
    (``torch.cuda.set_sync_debug_mode("warn")``: the device's own count, to set beside ``count_host_reads``); on
    another device the list stays empty."""
    caught: list = []
    if torch.device(device).type != "cuda":
        yield caught
        return
    with warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always")
        torch.cuda.set_sync_debug_mode("warn")
        try:
            yield caught
        finally:
            torch.cuda.set_sync_debug_mode(0)
            caught += [w for w in seen if "synchroniz" in str(w.message)]
