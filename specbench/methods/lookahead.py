"""Lookahead decoding (Fu et al. 2023): the target alone guesses n-grams by Jacobi iteration and verifies
them in the same forward (the step itself is decoding/jacobi.py, shared with Ouroboros' drafting).

The method is the proposer ``PoolLookahead`` plus config; the loop is decoding/loop.py. The first step's
forward also reads the prompt (prefill shares it). At temperature > 0 the n-gram trie is verified by
recursive rejection sampling (each n-gram a point-mass proposal), so the output is distributed exactly as
the target's; the window keeps guessing with the target's argmax. Raw counters: drafted = guess tokens fed
for verification (trie nodes), accepted = of those, emitted; extra: steps, steps_with_candidates,
ngrams_inserted, pool_size (at the end).
"""
from __future__ import annotations

import random

from ..decoding.jacobi import JacobiWindow, PoolLookahead
from ..decoding.ngram_pool import NGramPool
from ..errors import require
from ..errors import positive_int
from .base import ProposerMethod


class PooledMethod(ProposerMethod):
    """A method with an n-gram pool (``self.pool``): cleared before every prompt (cold start) unless
    ``warm_start``, in which case the pool carries over from prompt to prompt (Ouroboros' warm start)."""

    pool: NGramPool
    warm_start: bool = False

    def reset(self, seed: int = 0) -> None:
        super().reset(seed)
        if not self.warm_start:
            self.pool.clear()

    @property
    def carries_state(self) -> bool:
        return self.warm_start

    def carried_state(self):
        return self.pool.snapshot()

    def restore_state(self, state) -> None:
        self.pool.restore(state)


class Lookahead(PooledMethod):
    def __init__(self, pair, name: str = "lookahead", window: int = 5, ngram: int = 4, guesses: int = 5,
                 pool_from_prompt: bool = True, pool_capacity: int | None = None, warm_start: bool = False,
                 temperature: float = 0.0, top_p: float = 1.0, seed: int = 0):
        super().__init__(pair, name, temperature, top_p, seed)
        self.window = positive_int(window, "method.window", "Jacobi window W, columns of guesses")
        self.ngram = positive_int(ngram, "method.ngram", "n-gram size N")
        require(self.ngram >= 2, "method.ngram", f"must be >= 2 (N-1 lookahead levels), got {ngram}")
        self.guesses = positive_int(guesses, "method.guesses", "G, n-grams verified per step")
        capacity = positive_int(pool_capacity, "method.pool_capacity", "n-grams kept per first token", optional=True)
        self.pool_from_prompt, self.warm_start = bool(pool_from_prompt), bool(warm_start)
        self.pool = NGramPool(self.ngram, capacity)

    def step_blocks(self) -> dict[str, int]:
        return {"target": 1 + (self.window + self.guesses) * (self.ngram - 1)}  # x0, window, guessed n-grams

    def make_proposer(self, prompt_ids) -> PoolLookahead:
        prompt = list(prompt_ids)
        if self.pool_from_prompt:
            self.pool.insert_all(prompt)
        window = JacobiWindow(self.window, self.ngram, prompt, random.Random(self.sampler.seed))
        return PoolLookahead(self.pool, window, self.guesses)
