"""Lookahead decoding (Fu et al. 2023): the target alone guesses n-grams by Jacobi iteration and verifies
them in the same forward (the step itself is decoding/jacobi.py, shared with Ouroboros' drafting).

The first step's forward also reads the prompt (prefill shares it). Raw counters: drafted = guess
tokens fed for verification (trie nodes), accepted = of those, emitted; extra: steps,
steps_with_candidates, ngrams_inserted, pool_size (at the end).
"""
from __future__ import annotations

import random

from ..decoding.cached_lm import CachedLM
from ..decoding.generation import Generation, finalize_tokens, is_finished
from ..decoding.jacobi import JacobiWindow, lookahead_step
from ..decoding.ngram_pool import NGramPool
from ..errors import require
from .base import DecodingMethod, NoTimeline, positive_int


def greedy_only(name: str, temperature: float) -> None:
    require(temperature == 0, "sampling.temperature",
            f"method '{name}' verifies greedily and supports temperature 0 only, got {temperature}")


def optional_positive(value, key: str, meaning: str) -> int | None:
    return None if value is None else positive_int(value, key, meaning)


class PooledMethod(DecodingMethod):
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
        greedy_only(name, temperature)
        self.window = positive_int(window, "method.window", "Jacobi window W, columns of guesses")
        self.ngram = positive_int(ngram, "method.ngram", "n-gram size N")
        require(self.ngram >= 2, "method.ngram", f"must be >= 2 (N-1 lookahead levels), got {ngram}")
        self.guesses = positive_int(guesses, "method.guesses", "G, n-grams verified per step")
        capacity = optional_positive(pool_capacity, "method.pool_capacity", "n-grams kept per first token")
        self.pool_from_prompt, self.warm_start = bool(pool_from_prompt), bool(warm_start)
        self.pool = NGramPool(self.ngram, capacity)

    def generate(self, prompt_ids, max_new_tokens, eos_ids, timeline=NoTimeline()) -> Generation:
        target = CachedLM(self.pair.target)
        prompt = list(prompt_ids)
        if self.pool_from_prompt:
            self.pool.insert_all(prompt)
        window = JacobiWindow(self.window, self.ngram, prompt, random.Random(self.sampler.seed))
        gen = Generation(tokens=[])
        stats = {"steps": 0, "steps_with_candidates": 0, "ngrams_inserted": 0}
        out: list[int] = []
        pending = prompt  # committed tokens the target has not read
        while not is_finished(out, max_new_tokens, eos_ids):
            step = lookahead_step(target, pending, window, self.pool, self.guesses,
                                  max_accept=max_new_tokens - len(out) - 1)
            timeline.mark("prefill")  # first call only
            gen.drafted += step.guessed
            gen.add_step(out, step.accepted + [step.next_token], len(step.accepted), max_new_tokens, eos_ids)
            out += step.accepted + [step.next_token]
            pending = [step.next_token]
            stats["steps"] += 1
            stats["steps_with_candidates"] += step.had_candidates
            stats["ngrams_inserted"] += step.inserted
        gen.tokens = finalize_tokens(out, max_new_tokens, eos_ids)
        gen.count_forwards(target)
        gen.extra = {**stats, "pool_size": len(self.pool)}
        return gen
