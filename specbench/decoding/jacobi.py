"""One lookahead-decoding step (Fu et al. 2023), shared by ``lookahead`` (on the target) and by
Ouroboros' sentence drafting (on the draft model).

A step feeds one token tree (token_tree.py) after the cached prefix:
- ``pending``: committed tokens the model has not read yet, as a chain (the whole prompt on the first
  step, so prefill shares the forward); its last token x0 is the root everything hangs from;
- the lookahead branch (``JacobiWindow``): N-1 levels x W columns of guesses. Level 0 is a chain
  from x0 (columns 0..W-1); level j of column i hangs from level j-1 of column i, so every node sees
  x0, level 0 up to its column and its own column's earlier levels (Fu et al., Fig. 2b);
- the verification branch: n-grams of the pool whose first token is x0, merged into a trie.
Greedy verification walks the trie along the model's own argmax; the accepted tokens and the model's
next token are the step's output. The window then slides: each column's n-gram (its levels plus the
model's output at the top level) goes into the pool, the oldest level is dropped and the outputs
become the newest. Only the trie decides the output, so it is exactly what greedy decoding gives.
"""
from __future__ import annotations

import random
from dataclasses import dataclass
from typing import Sequence

from .cached_lm import CachedLM
from .ngram_pool import NGramPool
from .verify import verify_tree_greedy


def add_trie(tokens: list[int], parents: list[int], children: dict[int, list[int]], root: int,
             phrases: Sequence[Sequence[int]]) -> list[list[int]]:
    """Append phrases to the block as a trie under ``root`` (shared prefixes fed once).

    Returns each phrase's node indices; the number of nodes added is ``len(tokens)`` growth.
    """
    nodes_of = []
    for phrase in phrases:
        node, nodes = root, []
        for token in phrase:
            nxt = next((c for c in children.get(node, ()) if tokens[c] == token), None)
            if nxt is None:
                nxt = len(tokens)
                tokens.append(int(token))
                parents.append(node)
                children.setdefault(node, []).append(nxt)
            nodes.append(nxt)
            node = nxt
        nodes_of.append(nodes)
    return nodes_of


def chain(tokens: Sequence[int]) -> tuple[list[int], list[int]]:
    """(tokens, parents) of a plain sequence: node i hangs from node i-1, node 0 from the cache."""
    return list(tokens), list(range(-1, len(tokens) - 1))


class JacobiWindow:
    """The lookahead branch: ``levels[j][i]``, j < N-1 levels, i < W columns."""

    def __init__(self, width: int, ngram: int, seed_tokens: Sequence[int], rng: random.Random):
        self.width, self.ngram = width, ngram
        self.levels = [[rng.choice(list(seed_tokens)) for _ in range(width)] for _ in range(ngram - 1)]
        self._first = None  # block index of levels[0][0] after attach()

    def attach(self, tokens: list[int], parents: list[int], root: int) -> None:
        self._first = len(tokens)
        W = self.width
        for j, level in enumerate(self.levels):
            for i, token in enumerate(level):
                tokens.append(token)
                if j == 0:
                    parents.append(root if i == 0 else self._first + i - 1)
                else:
                    parents.append(self._first + (j - 1) * W + i)

    def slide(self, argmax: Sequence[int], pool: NGramPool) -> int:
        """Collect each column's n-gram into the pool and shift the levels; returns n-grams new to the pool."""
        W, top = self.width, self._first + (self.ngram - 2) * self.width
        outputs = [argmax[top + i] for i in range(W)]
        inserted = sum(pool.insert([level[i] for level in self.levels] + [outputs[i]]) for i in range(W))
        self.levels = self.levels[1:] + [outputs]
        return inserted


@dataclass
class StepResult:
    accepted: list[int]  # verified guess tokens
    next_token: int  # the model's token after them
    guessed: int  # trie nodes fed (guess tokens checked)
    had_candidates: bool
    inserted: int  # n-grams new to the pool


def tree_argmax(lm: CachedLM, tokens: list[int], parents: list[int], root: int) -> list[int]:
    """The model's argmax at every node of a token tree fed after the cache, in one forward.

    Only the rows from ``root`` on are computed (verification and the window read nothing before it; on the
    first step the pending chain is the whole prompt, prompt_len x V logits nobody needs); the returned list
    is still indexed by node, with -1 at the nodes before the root.
    """
    rows = lm.forward(tokens, parents=parents, keep_last=len(tokens) - root)  # (len(tokens) - root, V)
    return [-1] * root + rows.argmax(dim=-1).tolist()


def lookahead_step(lm: CachedLM, pending: Sequence[int], window: JacobiWindow | None, pool: NGramPool,
                   guesses: int | None, max_accept: int | None = None) -> StepResult:
    """One forward of ``lm`` over pending + window + candidate trie; the cache keeps pending + accepted.

    max_accept: at most this many guess tokens can still be used (the budget left minus the step's own next
    token); candidates are cut to it, so nothing is verified that the output could not keep.
    """
    tokens, parents = chain(pending)
    root = len(tokens) - 1
    if window is not None:
        window.attach(tokens, parents, root)
    children: dict[int, list[int]] = {}
    candidates = pool.newest(pending[-1], guesses)
    if max_accept is not None:
        candidates = [c[:max_accept] for c in candidates] if max_accept > 0 else []
    before = len(tokens)
    add_trie(tokens, parents, children, root, candidates)
    past = lm.length
    argmax = tree_argmax(lm, tokens, parents, root)
    path, next_token = verify_tree_greedy(tokens, children, argmax, root=root)
    lm.keep_positions(list(range(past + root + 1)) + [past + n for n in path])
    inserted = window.slide(argmax, pool) if window is not None else 0
    return StepResult([tokens[n] for n in path], next_token, len(tokens) - before, bool(candidates), inserted)
