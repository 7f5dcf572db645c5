"""A suffix array over one token array, and finding every occurrence of a pattern in it (REST's datastore index).

``tokens``: (n,) int32, documents concatenated, each followed by ``SEPARATOR`` (-1, below every token id), so no
match and no continuation crosses from one document into the next. ``suffix_array(tokens)``: (n,) int32, the
start positions of all suffixes in lexicographic order (a suffix that is a prefix of another sorts first).

Construction: prefix doubling (Manber & Myers) with numpy sorts: after round r every suffix has a rank by its first
2^r tokens; round r+1 sorts the pairs (rank[i], rank[i + 2^r]) and re-ranks, until every rank is distinct
(rounds: log2 of the longest repeated substring). O(n log n) per round, all in numpy: tens of millions of tokens
take a minute or two. REST used DraftRetriever's (Rust) suffix array; the order is the same.

``occurrences(tokens, sa, pattern)``: the half-open range [lo, hi) of ``sa`` whose suffixes start with
``pattern`` (two binary searches, O(len(pattern) log n)).
"""
from __future__ import annotations

from typing import Sequence

import numpy as np

SEPARATOR = -1  # after every document: sorts below every token id, and ends every continuation


def suffix_array(tokens: np.ndarray) -> np.ndarray:
    """(n,) int32 start positions of the suffixes of ``tokens`` in lexicographic order (module docstring)."""
    n = len(tokens)
    if n == 0:
        return np.zeros(0, np.int32)
    # ranks from 1 (0 stands for "past the end", which sorts first); rank < n + 1, so a pair fits one int64 key
    rank = np.unique(np.asarray(tokens), return_inverse=True)[1].astype(np.int64).reshape(-1) + 1
    span = 1  # every rank now orders the suffixes by their first ``span`` tokens
    while True:
        after = np.zeros(n, np.int64)
        if span < n:
            after[:n - span] = rank[span:]
        key = rank * (n + 1) + after  # (rank of tokens [i, i+span), rank of [i+span, i+2·span))
        order = np.argsort(key)
        sorted_key = key[order]
        fresh = np.empty(n, np.int64)
        fresh[order] = np.cumsum(np.concatenate(([1], sorted_key[1:] != sorted_key[:-1])))
        rank, span = fresh, span * 2
        if rank[order[-1]] == n or span >= n:  # every suffix has its own rank: sorted
            return order.astype(np.int32)


def _prefix(tokens: np.ndarray, start: int, length: int) -> list[int]:
    return tokens[start:start + length].tolist()


def occurrences(tokens: np.ndarray, sa: np.ndarray, pattern: Sequence[int]) -> tuple[int, int]:
    """[lo, hi): the positions of ``sa`` whose suffixes start with ``pattern`` (lo == hi: none)."""
    pattern, length = list(pattern), len(pattern)
    lo, hi = 0, len(sa)
    while lo < hi:  # first suffix whose first ``length`` tokens are >= pattern
        mid = (lo + hi) // 2
        if _prefix(tokens, int(sa[mid]), length) < pattern:
            lo = mid + 1
        else:
            hi = mid
    first, hi = lo, len(sa)
    while lo < hi:  # first suffix whose first ``length`` tokens are > pattern
        mid = (lo + hi) // 2
        if _prefix(tokens, int(sa[mid]), length) <= pattern:
            lo = mid + 1
        else:
            hi = mid
    return first, lo
