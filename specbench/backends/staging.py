"""Values between the host and a model's device without waiting for it.

On CUDA a copy from ordinary (pageable) host memory waits for every kernel queued before it: a host sync hidden in
each forward's input. Ids built from Python ints are therefore staged through pinned host memory (torch's caching
host allocator keeps each buffer alive until its copy has run) and copied without blocking; ids already on a device
(a draft's argmax, kept there: speculative.DraftChain) move device to device, queued like any kernel. On a CPU both
are plain tensors. Rows are taken from device tensors by slices and views (``rows_at``), never by an index tensor
built from Python ids, and what the host needs is read in one go (``read_scores_and_ids``).
"""
from __future__ import annotations

from typing import Sequence

import torch


def host_buffer(shape, dtype: torch.dtype, device: torch.device) -> torch.Tensor:
    """A zeroed host tensor to fill and copy to ``device``: pinned when ``device`` is a CUDA device."""
    return torch.zeros(shape, dtype=dtype, pin_memory=torch.device(device).type == "cuda")


def to_device(host: torch.Tensor, device: torch.device) -> torch.Tensor:
    """A host tensor's copy on ``device``, queued: through pinned memory on CUDA (the host tensor itself elsewhere)."""
    if torch.device(device).type == "cuda" and not host.is_pinned():
        host = host.pin_memory()
    return host.to(device, non_blocking=True)


def ids_on(ids: Sequence[int] | torch.Tensor, device: torch.device) -> torch.Tensor:
    """(n,) long ids on ``device``: a tensor is moved (queued, no host read), Python ids staged (module docstring)."""
    if isinstance(ids, torch.Tensor):
        return ids.to(device=device, dtype=torch.long, non_blocking=True)
    return to_device(torch.tensor(list(ids), dtype=torch.long), device)


def joined_ids(head: Sequence[int], tail: torch.Tensor, device: torch.device) -> torch.Tensor:
    """(len(head) + len(tail),) ids on ``device``: Python ``head`` (committed tokens) then device ``tail`` (drafts)."""
    return torch.cat([ids_on(head, device), ids_on(tail, device)]) if len(head) else ids_on(tail, device)


def rows_at(logits: torch.Tensor, index: Sequence[int]) -> torch.Tensor:
    """``logits[index]`` ((len(index), V)) without an index tensor from the host: a slice where ``index`` is a
    run of consecutive rows (a chain's accepted prefix), else one stack of row views (a tree's path)."""
    if list(index) == list(range(index[0], index[0] + len(index))):
        return logits[index[0]:index[0] + len(index)]
    return torch.stack([logits[i] for i in index])


def read_scores_and_ids(scores: torch.Tensor, ids: torch.Tensor) -> tuple[list, list]:
    """One host read of (r, k) scores and (r, k) token ids: (scores as floats, ids as ints), nested lists. Read as
    float64 together: float32 scores are exact in it, and so are ids (< 2^53)."""
    both = torch.stack([scores.double(), ids.double()]).tolist()
    return both[0], [[int(i) for i in row] for row in both[1]]
