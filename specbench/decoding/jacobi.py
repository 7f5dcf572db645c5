"""One lookahead-decoding step (Fu et al. 2023), shared by ``lookahead`` (on the target) and by
Ouroboros' sentence drafting (on the draft model).

A step feeds one token tree (token_tree.py) after the cached prefix:
- ``pending``: committed tokens the model has not read yet, as a chain (the whole prompt on the first
  step, so prefill shares the forward); its last token x0 is the root everything hangs from;
- the lookahead branch (``JacobiWindow``): N-1 levels x W columns of guesses. Level 0 is a chain
  from x0 (columns 0..W-1); level j of column i hangs from level j-1 of column i, so every node sees
  x0, level 0 up to its column and its own column's earlier levels (Fu et al., Fig. 2b);
- the verification branch: n-grams of the pool whose first token is x0, merged into a trie.
In the speculative loop (loop.py) the trie is the proposal (point masses: n-grams are proposed
deterministically) and the window its side nodes. Verification walks the trie along the model's argmax at
temperature 0, or samples along it by recursive rejection sampling above (Fu et al.'s sampling mode; the
output is then distributed as the model's); the accepted tokens and the model's next token are the step's
output. The window then slides: each column's n-gram (its levels plus the model's argmax at the top level)
goes into the pool, the oldest level is dropped and the outputs become the newest. Only the trie decides
the output, so at temperature 0 it is exactly what greedy decoding gives.
"""
from __future__ import annotations

import random
from typing import Sequence

from ..backends.torch.cached_lm import CachedLM
from .loop import verify_step
from .ngram_pool import NGramPool
from .proposal import Proposal, Step, StepContext


class JacobiWindow:
    """The lookahead branch: ``levels[j][i]``, j < N-1 levels, i < W columns, fed as side nodes."""

    def __init__(self, width: int, ngram: int, seed_tokens: Sequence[int], rng: random.Random):
        self.width, self.ngram = width, ngram
        self.levels = [[rng.choice(list(seed_tokens)) for _ in range(width)] for _ in range(ngram - 1)]

    def nodes(self) -> tuple[list[int], list[int]]:
        """(tokens, parents) of the window as side nodes: level j column i is node j*W + i; level 0 is a chain
        from x0 (-1), level j of column i hangs from level j-1 of column i."""
        W = self.width
        tokens = [token for level in self.levels for token in level]
        parents = [(i - 1 if j == 0 else (j - 1) * W + i) for j in range(len(self.levels)) for i in range(W)]
        return tokens, parents

    def slide(self, side_argmax: Sequence[int], pool: NGramPool) -> int:
        """Collect each column's n-gram into the pool and shift the levels; returns n-grams new to the pool.
        side_argmax: the model's argmax at every window node (``Step.side_argmax``)."""
        W, top = self.width, (self.ngram - 2) * self.width
        outputs = [side_argmax[top + i] for i in range(W)]
        inserted = sum(pool.insert([level[i] for level in self.levels] + [outputs[i]]) for i in range(W))
        self.levels = self.levels[1:] + [outputs]
        return inserted


class PoolLookahead:
    """Proposer of lookahead decoding: the pool's newest n-grams starting with x0 (at most ``guesses``), as a
    trie, plus the Jacobi window as side nodes; ``observe`` slides the window with the model's outputs."""

    draft = None  # proposes from the verifying model's own forward

    def __init__(self, pool: NGramPool, window: JacobiWindow | None, guesses: int | None):
        self.pool, self.window, self.guesses = pool, window, guesses
        self.stats = {"steps": 0, "steps_with_candidates": 0, "ngrams_inserted": 0}

    def propose(self, context: StepContext) -> Proposal:
        candidates = self.pool.newest(context.tokens[-1], self.guesses)
        candidates = [c[:context.room] for c in candidates] if context.room > 0 else []
        proposal = Proposal(fed_as_tree=True)
        proposal.add_paths(candidates)
        if self.window is not None:
            proposal.side_tokens, proposal.side_parents = self.window.nodes()
        self.stats["steps"] += 1
        self.stats["steps_with_candidates"] += bool(candidates)
        return proposal

    def observe(self, step: Step) -> None:
        if self.window is not None:
            self.stats["ngrams_inserted"] += self.window.slide(step.side_argmax, self.pool)

    def extra(self) -> dict:
        return {**self.stats, "pool_size": len(self.pool)}


def lookahead_step(lm: CachedLM, tokens: list[int], window: JacobiWindow | None, pool: NGramPool,
                   guesses: int | None) -> Step:
    """One greedy lookahead step of ``lm`` after the committed ``tokens`` (appended to in place): one forward
    over what it has not read + window + candidate trie; the cache keeps the committed tokens but the last
    (Ouroboros' phrase drafting on the draft model)."""
    proposer = PoolLookahead(pool, window, guesses)
    step = verify_step(lm, tokens, proposer.propose(StepContext(tokens, 0, 1 << 30, set(), None)),
                       None)
    proposer.observe(step)
    return step
