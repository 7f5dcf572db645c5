"""CUDA graphs: capture a function of static buffers once, replay it (``model.execution: graphs``).

``cuda_capture`` is what StaticModel and a draft head's StaticHead capture each bucket's forward with;
``GraphedCall`` runs a small function of fixed-shape tensors (DISCO's classifier) from a graph. Tests on a CPU
pass a stand-in capture that replays by re-running (tests/test_static_execution.py); the real one needs CUDA.
"""
from __future__ import annotations

from typing import Callable

import torch


def cuda_capture(fn: Callable[[], torch.Tensor], device: torch.device | None = None) -> Callable[[], torch.Tensor]:
    """Capture ``fn`` (reads and writes static buffers only) as a CUDA graph on ``device`` (the model's: its
    streams, pool and graph there, whatever the current device is); returns its replay, which gives the graph's
    static output. Two warm-up runs on a side stream first (lazy kernels, cuBLAS workspaces)."""
    device = torch.device(device if device is not None else "cuda")
    with torch.cuda.device(device):
        stream = torch.cuda.Stream()
        stream.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(stream):
            for _ in range(2):
                fn()
        torch.cuda.current_stream().wait_stream(stream)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph, pool=_pool(device)):
            out = fn()

    def replay() -> torch.Tensor:
        with torch.cuda.device(device):
            graph.replay()
        return out

    return replay


class GraphedCall:
    """A small function of fixed-shape tensors run from a CUDA graph (DISCO's classifier on every draft token):
    the arguments are copied into static buffers shaped like the first call's, then the graph replays. Captured at
    the first call; ``capture`` as StaticModel's (None: the function is called directly)."""

    def __init__(self, fn: Callable, capture: Callable | None):
        self.fn, self.capture = fn, capture
        self.inputs: list[torch.Tensor] | None = None
        self.replay: Callable | None = None

    @torch.inference_mode()
    def __call__(self, *args: torch.Tensor):
        if self.capture is None:
            return self.fn(*args)
        if self.inputs is None or any(a.shape != b.shape for a, b in zip(args, self.inputs)):
            self.inputs = [a.clone() for a in args]
            inputs = self.inputs
            self.replay = self.capture(lambda: self.fn(*inputs), inputs[0].device)
        for buffer, value in zip(self.inputs, args):
            buffer.copy_(value)
        return self.replay()


_POOLS: dict = {}


def _pool(device: torch.device):
    """One memory pool per device for every graph of this process there: they replay one at a time, and each
    output is read before the next replay."""
    if device not in _POOLS:
        with torch.cuda.device(device):
            _POOLS[device] = torch.cuda.graph_pool_handle()
    return _POOLS[device]
