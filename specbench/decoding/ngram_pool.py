"""The n-gram candidate pool P shared by lookahead decoding and Ouroboros.

Phrases c_1..c_β are keyed by their first token: P(v) = {c_2..c_β | c_1 = v} (Ouroboros eq. 1), kept
in insertion order. With a capacity W, each P(v) holds at most W suffixes and evicts the least
recently inserted one (re-inserting a suffix makes it the newest again: LRU on insertion).
"""
from __future__ import annotations

from collections import OrderedDict
from typing import Iterable, Sequence


class NGramPool:
    def __init__(self, n: int, capacity: int | None = None):
        """n: phrase length β (the key token included); capacity: W, suffixes kept per key (None: no cap)."""
        if n < 2:
            raise ValueError(f"n-gram length must be >= 2, got {n}")
        if capacity is not None and capacity < 1:
            raise ValueError(f"pool capacity must be >= 1 or None, got {capacity}")
        self.n, self.capacity = n, capacity
        self._table: dict[int, OrderedDict[tuple[int, ...], None]] = {}

    def __len__(self) -> int:
        return sum(len(v) for v in self._table.values())

    def __contains__(self, phrase: Sequence[int]) -> bool:
        return tuple(phrase[1:]) in self._table.get(phrase[0], {})

    def clear(self) -> None:
        self._table.clear()

    def snapshot(self) -> dict[int, list[tuple[int, ...]]]:
        """A copy of the pool (each key's suffixes oldest first), for ``restore``."""
        return {key: list(suffixes) for key, suffixes in self._table.items()}

    def restore(self, snapshot: dict[int, list[tuple[int, ...]]] | None) -> None:
        """Make the pool what ``snapshot`` was (None: empty)."""
        self._table = {key: OrderedDict.fromkeys(suffixes) for key, suffixes in (snapshot or {}).items()}

    def insert(self, phrase: Sequence[int]) -> bool:
        """Add c_1..c_β (newest); True when it was not in the pool before."""
        if len(phrase) != self.n:
            raise ValueError(f"phrase of length {len(phrase)} in a pool of {self.n}-grams")
        suffixes = self._table.setdefault(int(phrase[0]), OrderedDict())
        suffix = tuple(int(t) for t in phrase[1:])
        is_new = suffix not in suffixes
        suffixes[suffix] = None
        suffixes.move_to_end(suffix)
        if self.capacity is not None and len(suffixes) > self.capacity:
            suffixes.popitem(last=False)
        return is_new

    def insert_all(self, tokens: Sequence[int]) -> int:
        """Insert every n-gram of a token sequence (e.g. the prompt); returns how many were new."""
        return sum(self.insert(tokens[i: i + self.n]) for i in range(len(tokens) - self.n + 1))

    def newest(self, key: int, k: int | None = None) -> list[tuple[int, ...]]:
        """Up to k suffixes c_2..c_β of P(key), newest first."""
        suffixes = list(reversed(self._table.get(int(key), {})))
        return suffixes if k is None else suffixes[:k]

    def replace(self, key: int, old: Iterable[int], new: Iterable[int]) -> None:
        """Candidate refinement: drop the suffix ``old`` of P(key) and insert ``new`` as the newest."""
        self._table.get(int(key), OrderedDict()).pop(tuple(old), None)
        self.insert((key, *new))
