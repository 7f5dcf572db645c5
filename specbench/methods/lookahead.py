"""Lookahead decoding (Fu et al. 2023): the target alone guesses n-grams by Jacobi iteration and verifies
them in the same forward.

Each step feeds one token tree (decoding/token_tree.py) after the committed prefix:
- the root x0: the last committed token, not yet in the cache;
- the lookahead branch, a 2-D window of N-1 levels x W columns of guesses: level 0 is a chain hanging
  from x0 (columns 0..W-1), and level j of column i hangs from level j-1 of column i, so every node
  sees x0, level 0 up to its column, and its own column's earlier levels (Fu et al., Fig. 2b);
- the verification branch: up to G n-grams of the pool whose first token is x0, merged into a trie.
Greedy verification walks the trie along the target's own argmax; the accepted tokens plus the target's
next token are emitted (τ counts both). The window then slides: each column's n-gram (its N-1 levels
plus the target's output at the top level) goes into the pool, the oldest level is dropped and the
outputs become the newest level. Only the verification branch decides what is emitted, so the output
is exactly greedy's; the lookahead branch only feeds the pool.

Raw counters: drafted = tokens of the verification trie (the guesses checked), accepted = of those,
emitted; extra: pool_size at the end, steps, steps_with_candidates, ngrams_inserted.
"""
from __future__ import annotations

import random

from ..decoding.cached_lm import CachedLM
from ..decoding.generation import Generation, finalize_tokens, is_finished
from ..decoding.ngram_pool import NGramPool
from ..decoding.verify import verify_tree_greedy
from ..errors import require
from .base import DecodingMethod, NoTimeline, positive_int


def add_trie(tokens: list[int], parents: list[int], children: dict[int, list[int]], root: int,
             phrases: list[tuple[int, ...]]) -> int:
    """Append phrases to the block as a trie under ``root`` (shared prefixes fed once); returns nodes added."""
    added = 0
    for phrase in phrases:
        node = root
        for token in phrase:
            nxt = next((c for c in children.get(node, ()) if tokens[c] == token), None)
            if nxt is None:
                nxt = len(tokens)
                tokens.append(token)
                parents.append(node)
                children.setdefault(node, []).append(nxt)
                added += 1
            node = nxt
    return added


class Lookahead(DecodingMethod):
    def __init__(self, pair, name: str = "lookahead", window: int = 5, ngram: int = 4, guesses: int = 5,
                 pool_from_prompt: bool = True, pool_capacity: int | None = None, warm_start: bool = False,
                 temperature: float = 0.0, top_p: float = 1.0, seed: int = 0):
        super().__init__(pair, name, temperature, top_p, seed)
        require(temperature == 0, "sampling.temperature",
                f"method '{name}' verifies greedily and supports temperature 0 only, got {temperature}")
        self.window = positive_int(window, "method.window", "Jacobi window W, columns of guesses")
        self.ngram = positive_int(ngram, "method.ngram", "n-gram size N")
        require(self.ngram >= 2, "method.ngram", f"must be >= 2 (N-1 lookahead levels), got {ngram}")
        self.guesses = positive_int(guesses, "method.guesses", "G, n-grams verified per step")
        require(pool_capacity is None or positive_int(pool_capacity, "method.pool_capacity", "n-grams per key"),
                "method.pool_capacity", "must be null or a positive integer")
        self.pool_from_prompt, self.warm_start = bool(pool_from_prompt), bool(warm_start)
        self.pool = NGramPool(self.ngram, pool_capacity)
        self.seed = seed

    def reset(self, seed: int = 0) -> None:
        super().reset(seed)
        self.seed = seed
        if not self.warm_start:
            self.pool.clear()

    def generate(self, prompt_ids, max_new_tokens, eos_ids, timeline=NoTimeline()) -> Generation:
        target = CachedLM(self.pair.target)
        W, N = self.window, self.ngram
        prompt = list(prompt_ids)
        if self.pool_from_prompt:
            self.pool.insert_all(prompt)
        rng = random.Random(self.seed)
        levels = [[rng.choice(prompt) for _ in range(W)] for _ in range(N - 1)]  # (N-1, W) initial guesses

        logits = target.forward(prompt, keep_last=1)
        timeline.mark("prefill")
        out = [int(logits[-1].argmax())]
        accept_lengths, drafted, accepted = [1], 0, 0
        stats = {"steps": 0, "steps_with_candidates": 0, "ngrams_inserted": 0}
        while not is_finished(out, max_new_tokens, eos_ids):
            x0 = out[-1]
            # 1. the block: root, lookahead window (column i of level j at index 1 + j*W + i), trie of guesses
            tokens, parents = [x0], [-1]
            for j in range(N - 1):
                for i in range(W):
                    tokens.append(levels[j][i])
                    parents.append((i if i > 0 else 0) if j == 0 else 1 + (j - 1) * W + i)
            children: dict[int, list[int]] = {}
            candidates = self.pool.newest(x0, self.guesses)
            drafted += add_trie(tokens, parents, children, 0, candidates)
            # 2. one target forward over the tree
            past = target.length
            argmax = target.forward(tokens, parents=parents).argmax(dim=-1).tolist()
            # 3. verification: longest trie path the target agrees with, plus its next token
            path, bonus = verify_tree_greedy(tokens, children, argmax)
            accepted += len(path)
            out.extend([tokens[n] for n in path] + [bonus])
            accept_lengths.append(len(path) + 1)
            target.keep_positions(list(range(past + 1)) + [past + n for n in path])
            # 4. slide the window; each column's n-gram goes into the pool
            top = [argmax[1 + (N - 2) * W + i] for i in range(W)]
            for i in range(W):
                stats["ngrams_inserted"] += self.pool.insert([levels[j][i] for j in range(N - 1)] + [top[i]])
            levels = levels[1:] + [top]
            stats["steps"] += 1
            stats["steps_with_candidates"] += bool(candidates)
        return Generation(
            tokens=finalize_tokens(out, max_new_tokens, eos_ids),
            target_forwards=target.forwards,
            drafted=drafted,
            accepted=accepted,
            accept_lengths=accept_lengths,
            extra={**stats, "pool_size": len(self.pool)},
        )
