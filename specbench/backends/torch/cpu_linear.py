"""bf16 linear layers with oneDNN-prepacked weights, for CPUs with native bf16 (``model.linear_kernel``).

Stock ``F.linear`` in bf16 hands oneDNN a plain row-major weight on every call, so each call reorders
or reads the weight in a layout its kernel does not want. Packing each weight once, at load time, into
oneDNN's blocked layout (``torch.ops.mkldnn._reorder_linear_weight``) and calling
``torch.ops.mkldnn._linear_pointwise`` is what inductor's freezing pass does for compiled CPU models; here
it is done in eager mode, so nothing is compiled.

Measured on the embedded target (bf16, 2 threads, Intel Xeon with AVX512-BF16, after a 300-token prompt):
one-token forward 214 -> 148 ms; 5 tokens 300 -> 187 ms; 300-token prefill 5.3 -> 5.0 s. The packed copy
replaces the weight (no extra memory), except where the weight is tied to the input embeddings (the
embedding keeps its own copy). Results equal stock bf16 up to summation order; the losslessness check
(analysis/lossless.py) measures and tolerates exactly that kind of difference.
"""
from __future__ import annotations

import torch


class PackedLinear(torch.nn.Module):
    """y = x W^T + b with W held in oneDNN's prepacked layout. Same call signature as nn.Linear."""

    def __init__(self, linear: torch.nn.Linear):
        super().__init__()
        self.in_features, self.out_features = linear.in_features, linear.out_features
        weight = linear.weight.detach()
        # batch-size hint 1: decoding feeds 1..a few dozen rows; prefill is compute-bound either way
        self.packed = torch.ops.mkldnn._reorder_linear_weight(weight, 1)
        self.bias = None if linear.bias is None else linear.bias.detach()
        self.dtype = weight.dtype

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.ops.mkldnn._linear_pointwise(x, self.packed, self.bias, "none", [], "")

    def extra_repr(self) -> str:
        return (f"in_features={self.in_features}, out_features={self.out_features}, bias={self.bias is not None}, "
                "oneDNN prepacked")


def pack_linears(model: torch.nn.Module) -> int:
    """Replace every nn.Linear in ``model`` by a PackedLinear (in place); returns how many were replaced."""
    replaced = 0
    for module in list(model.modules()):
        for name, child in list(module.named_children()):
            if isinstance(child, torch.nn.Linear):
                setattr(module, name, PackedLinear(child))
                replaced += 1
    return replaced


def apply_linear_kernel(model: torch.nn.Module, kernel: str) -> torch.nn.Module:
    """Put ``model`` on the resolved linear kernel (precision.Precision.linear_kernel)."""
    if kernel == "onednn_packed":
        pack_linears(model)
    elif kernel != "torch":
        raise ValueError(f"unknown linear kernel {kernel!r}")
    return model
