"""A suffix automaton (SAM) over token ids, built online, and a matcher that follows a growing sequence through it
(SAM Decoding, Hu et al. 2024, §3: the longest suffix of the generated text that occurs in the reference text).

The automaton of a text T is the smallest DFA accepting T's suffixes; each state is an endpos-equivalence class of
T's substrings. Per state: ``length`` (its longest string), ``link`` (the suffix link: the state of the longest
suffix in another class), ``next`` (transitions, token -> state) and ``first_end`` (the smallest end position of
its strings in T: where their first occurrence ends, the paper's ``min_endpos``). The classic online construction
(Blumer et al. 1985) appends one token in O(1) amortized time; a state is cloned when a class splits.

``Match`` is the matching-statistics walk: after each token of a query sequence it holds (state, length), the
longest suffix of the query read so far that occurs in T. Reading a token costs O(1) amortized (follow suffix links
until a transition exists). The same walk serves both of the paper's automata:

- the dynamic one (prompt + generated tokens): ``SuffixAutomaton.extend`` reads a token into the match *before*
  appending it, so the match is always against the text strictly before the token: an earlier occurrence, followed
  by at least one token (the suffix itself never counts, as in prompt lookup);
- a static one over a corpus (``SuffixAutomaton.of_sequences``: the sequences joined by distinct negative
  separators, which match nothing, so no match and no continuation crosses from one sequence into the next).

A match that T keeps growing under stays valid: when appending clones the match's state q, a match no longer than
the clone's ``length`` now belongs to the clone (its strings moved there), so ``extend`` moves it.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Iterable, Sequence


@dataclass
class Match:
    """The longest suffix of the sequence read so far that occurs in the text: its state and its length."""

    state: int = 0  # 0: the root (the empty string)
    length: int = 0


class SuffixAutomaton:
    """The SAM of ``tokens`` (module docstring); state 0 is the root."""

    def __init__(self):
        self.length: list[int] = [0]
        self.link: list[int] = [-1]
        self.next: list[dict[int, int]] = [{}]
        self.first_end: list[int] = [-1]
        self.tokens: list[int] = []  # the text T
        self.last = 0  # the state of the whole text
        self.match = Match()  # for the dynamic use (extend): the text read against itself, one token behind
        self.sequences: list[list[int]] = []  # a static automaton's sequences (of_sequences)

    @classmethod
    def of_sequences(cls, sequences: Iterable[Sequence[int]]) -> "SuffixAutomaton":
        """A static automaton over several token sequences, joined by separators -1, -2, ... (never a token id)."""
        sam = cls()
        sam.sequences = [list(sequence) for sequence in sequences]
        for i, sequence in enumerate(sam.sequences):
            for token in sequence:
                sam.append(int(token))
            sam.append(-1 - i)
        return sam

    def __len__(self) -> int:
        return len(self.length)

    def _new_state(self, length: int, link: int, next_: dict[int, int], first_end: int) -> int:
        self.length.append(length)
        self.link.append(link)
        self.next.append(next_)
        self.first_end.append(first_end)
        return len(self.length) - 1

    def append(self, token: int) -> None:
        """Extend T by one token (the online construction); keeps ``self.match`` pointing at its class."""
        end = len(self.tokens)
        self.tokens.append(token)
        cur = self._new_state(self.length[self.last] + 1, 0, {}, end)
        p = self.last
        while p != -1 and token not in self.next[p]:
            self.next[p][token] = cur
            p = self.link[p]
        if p != -1:
            q = self.next[p][token]
            if self.length[p] + 1 == self.length[q]:
                self.link[cur] = q
            else:  # q's class splits: its strings of length <= length[p] + 1 move to a clone
                clone = self._new_state(self.length[p] + 1, self.link[q], dict(self.next[q]), self.first_end[q])
                while p != -1 and self.next[p].get(token) == q:
                    self.next[p][token] = clone
                    p = self.link[p]
                self.link[q] = self.link[cur] = clone
                if self.match.state == q and self.match.length <= self.length[clone]:
                    self.match.state = clone
        self.last = cur

    def read(self, match: Match, token: int) -> Match:
        """The match after one more query token: the longest suffix of the match that the token extends, plus it
        (follow suffix links while no transition on ``token`` exists); the root when none does."""
        state, length = match.state, match.length
        while state != 0 and token not in self.next[state]:
            state = self.link[state]
            length = self.length[state]
        if token in self.next[state]:
            return Match(self.next[state][token], length + 1)
        return Match(0, 0)

    def extend(self, token: int) -> None:
        """Dynamic use: read ``token`` into ``self.match`` against the text before it, then append it."""
        self.match = self.read(self.match, token)
        self.append(token)

    def continuation(self, match: Match, want: int) -> list[int]:
        """Up to ``want`` tokens of T after the first occurrence of the match (the paper's ``min_endpos``), cut at a
        separator. While the first occurrence is followed by fewer than ``want`` tokens (before a separator), a
        shorter suffix of the match (its suffix link, whose first occurrence ends no later) is used instead, down to
        a single token (the paper's ``to_anc``: a loop of period p < want then gives the whole continuation, not p
        tokens)."""
        if match.length == 0 or want <= 0:
            return []
        state = match.state
        while self.link[state] > 0:  # the cheap test first: tokens after the first end, separators not counted
            if len(self.tokens) - 1 - self.first_end[state] >= want and len(self._after(state, want)) == want:
                break
            state = self.link[state]
        return self._after(state, want)

    def _after(self, state: int, want: int) -> list[int]:
        """Up to ``want`` tokens after the first occurrence of ``state``'s strings, cut at a separator."""
        start = self.first_end[state] + 1
        out = self.tokens[start:start + want]
        cut = next((i for i, token in enumerate(out) if token < 0), len(out))
        return out[:cut]
