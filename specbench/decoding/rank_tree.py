"""Static draft trees written as rank paths (Medusa's and EAGLE-1's tree choices, Token Recycling's template).

A node is a path of ranks [r_1, ..., r_d]: the r_1-th candidate after x0, then the r_2-th candidate after that token,
and so on; a method fills the paths from its own ranked candidates (Token Recycling's adjacency matrix, an EAGLE
head's distribution). ``method.tree`` gives the tree as rank paths, or as per-depth widths [w_1, ..., w_D] (every
node at depth d−1 gets ranks 0..w_d−1: SpecInfer's expansion shape).
"""
from __future__ import annotations

from collections.abc import Sequence as SequenceABC

from ..errors import require

MAX_NODES = 1024  # a template larger than this is a typo (widths multiply), not a tree one forward can verify


def by_depth(template) -> list[list[tuple[int, ...]]]:
    """A template's paths by depth: ``[d - 1]`` holds its paths of length d, in template order ([] for None)."""
    return [[tuple(p) for p in template or () if len(p) == d] for d in range(1, max(map(len, template or [[]])) + 1)]


def parse_tree(tree) -> list[list[int]]:
    """``method.tree`` as rank paths in BFS order (by depth, then by ranks): per-depth widths [w_1, ..., w_D]
    become the full tree (every node at depth d−1 gets ranks 0..w_d−1); explicit paths are checked (distinct,
    non-negative ranks, every path's parent path present)."""
    shape = "a non-empty list of per-depth widths (e.g. [4, 2, 1]) or of rank paths (e.g. [[0], [1], [0, 0]])"
    is_int = lambda v: isinstance(v, int) and not isinstance(v, bool)  # noqa: E731
    is_seq = lambda v: isinstance(v, SequenceABC) and not isinstance(v, str)  # noqa: E731 (ListConfig too)
    require(is_seq(tree) and len(tree) > 0, "method.tree", f"must be {shape}, got {tree!r}")
    items = list(tree)
    if all(is_int(w) for w in items):
        require(all(w >= 1 for w in items), "method.tree", f"widths must be positive integers, got {items}")
        paths, level = [], [[]]
        for width in items:
            level = [parent + [rank] for parent in level for rank in range(width)]
            require(len(paths) + len(level) <= MAX_NODES, "method.tree",
                    f"widths {items} make more than {MAX_NODES} nodes")
            paths += level
        return paths
    require(all(is_seq(p) and len(p) > 0 and all(is_int(r) and r >= 0 for r in p) for p in items), "method.tree",
            f"must be {shape}, got {tree!r}")
    paths = [[int(r) for r in p] for p in items]
    keys = {tuple(p) for p in paths}
    require(len(keys) == len(paths), "method.tree", "a rank path is listed twice")
    orphan = next((p for p in paths if len(p) > 1 and tuple(p[:-1]) not in keys), None)
    require(orphan is None, "method.tree", f"path {orphan} has no parent path {orphan and orphan[:-1]}")
    require(len(paths) <= MAX_NODES, "method.tree", f"{len(paths)} nodes, more than {MAX_NODES}")
    return sorted(paths, key=lambda p: (len(p), p))
