"""Token trees fed to a model in one forward: attention mask and position ids from parent links.

A block of n new tokens sits after ``past`` cached positions. Node i has a parent inside the block
(``parents[i] >= 0``, an earlier index) or hangs off the cached prefix (``parents[i] == -1``). Each
node attends to every cached position, to its ancestors and to itself — nothing else — and sits at
position ``past + depth(i)``, so its output is exactly what an autoregressive forward over the path
root..i would give. Lookahead's window, its verification n-grams, and Ouroboros' sentence draft with
K suffixes (its Figure 2) are all such trees.
"""
from __future__ import annotations

from typing import Sequence

import torch

from .staging import to_device


def depths(parents: Sequence[int]) -> list[int]:
    out: list[int] = []
    for i, p in enumerate(parents):
        if not -1 <= p < i:
            raise ValueError(f"node {i}: parent {p} must be -1 or an earlier node")
        out.append(0 if p < 0 else out[p] + 1)
    return out


def ancestors_mask(parents: Sequence[int]) -> torch.Tensor:
    """(n, n) bool: [i, j] is True when j is i or an ancestor of i."""
    n = len(parents)
    visible = torch.zeros(n, n, dtype=torch.bool)
    for i, p in enumerate(parents):
        if p >= 0:
            visible[i] = visible[p]
        visible[i, i] = True
    return visible


def tree_layout(parents: Sequence[int], past: int,
                cached_parents: Sequence[int] = ()) -> tuple[int, list[int], torch.Tensor]:
    """Where a block of tree nodes sits and what it sees: (prefix, positions, local).

    prefix: the cached positions every new node sees (the committed prefix, ``past - m``); positions: each new
    node's position id; local (n, m + n) bool: what each new node sees among the m cached tree nodes and the new
    ones (its ancestors and itself). See ``tree_inputs`` for ``cached_parents``.
    """
    m = len(cached_parents)
    if m > past:
        raise ValueError(f"{m} cached tree nodes but only {past} cached positions")
    links = list(cached_parents) + list(parents)
    return past - m, [past - m + d for d in depths(links)[m:]], ancestors_mask(links)[m:]


def tree_inputs(parents: Sequence[int], past: int, dtype: torch.dtype, device,
                cached_parents: Sequence[int] = ()) -> tuple[torch.Tensor, torch.Tensor]:
    """(attention mask (1, 1, n, past + n) additive float: 0 visible / finfo.min hidden, position ids (1, n)).

    cached_parents: the parent links of m tree nodes already in the cache, as its last m positions (fed by
    earlier calls; the ``past - m`` positions before them are the committed prefix). Node numbering then runs
    on across calls: cached node j is node j, new node i is node m + i, and ``parents`` of the new nodes use
    that numbering (-1: hangs off the prefix; 0..m-1: a cached node; m..m+i-1: an earlier new node). Each new
    node sees the prefix, its ancestors among cached and new nodes, and itself, at position
    ``past - m + depth``: growing a tree one level per call (SpecInfer's draft expansion) gives what one call
    over the whole tree would. Empty (the default): every cached position is prefix, as before.
    """
    prefix, positions, local = tree_layout(parents, past, cached_parents)
    # only the (n, m + n) local pattern and the position ids cross to the device (staged); the mask over the
    # prefix is built there
    local, position_ids = to_device(local, device), to_device(torch.tensor([positions], dtype=torch.long), device)
    visible = torch.ones(len(parents), prefix + local.shape[1], dtype=torch.bool, device=device)
    visible[:, prefix:] = local
    mask = torch.zeros(visible.shape, dtype=dtype, device=device).masked_fill_(~visible, torch.finfo(dtype).min)
    return mask[None, None], position_ids


def path_to(parents: Sequence[int], node: int) -> list[int]:
    """Node indices from the root to ``node`` (inclusive)."""
    path = []
    while node >= 0:
        path.append(node)
        node = parents[node]
    return path[::-1]
