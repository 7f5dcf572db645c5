"""Ouroboros (Zhao et al. 2024, Algorithm 1): phrase-level drafting with a candidate pool shared by the
draft and the target, longer drafts from candidate suffixes, and a pool fed by the target's verification.

One step, with the switches that turn each component off for the Table 3 ablation:
(a) ``phrase_draft``: the sentence draft d is written phrase by phrase: each draft forward is a
    lookahead step of the draft model (decoding/jacobi.py: Jacobi window + verification of the pool's
    phrases for the last token), appending the accepted phrase and the draft's next token, until
    |d| >= γ. Off: γ plain draft forwards, one token each.
(b) ``candidate_suffixes``: the K newest suffixes c_2..c_β of P(d_last) are hung after d ...
(c) ... and d plus all suffixes are verified in ONE target forward (the Figure 2 mask: each suffix sees
    the prefix and d, is causal inside itself, sees no other suffix). Greedy verification: l_d tokens of
    d agree; if all do, the best suffix (longest agreement l_c) continues; then the target's next token.
(d) ``inspiration``: when l_d < |d|, every later run where d_{i..i+β-2} = d̂_{i..i+β-2} puts the target's
    phrase d̂_{i..i+β-1} into the pool (Algorithm 1).
(e) ``refinement``: each verified suffix c is replaced in the pool by the target's outputs ĉ along it.
(f) ``warm_start``: the pool is kept across prompts; cold start clears it per prompt.
The pool holds phrases of β tokens, at most W per first token (LRU). Output at temperature 0 is
exactly greedy's: only the target's argmax decides what is emitted.

Raw counters: drafted = guess tokens fed to the target (|d| + suffix trie nodes), accepted = tokens of d
accepted + suffix tokens accepted; extra: per-step lists sentence_draft_len, draft_accepted (l_d),
suffix_won (index into the K suffixes, -1 none), suffix_accepted (l_c), pool_size; totals
draft_phrase_steps, draft_pool_hits (draft steps that accepted a pooled phrase), suffix_tokens,
inspirations (new phrases), refinements (suffixes changed); with ``match_stats`` the Table 1 numbers per
rejected step: lcp (l_d) and match_k[k] (#Match-k of the discarded d_{l_d+2..} vs d̂_{l_d+2..}).
"""
from __future__ import annotations

import random

from ..decoding.cached_lm import CachedLM, draft_lm
from ..decoding.generation import Generation, finalize_tokens, is_finished
from ..decoding.jacobi import JacobiWindow, add_trie, chain, lookahead_step, tree_argmax
from ..decoding.ngram_pool import NGramPool
from ..decoding.verify import verify_tree_greedy
from ..errors import require
from .base import NoTimeline, positive_int
from .lookahead import PooledMethod, greedy_only, optional_positive

MATCH_K = (1, 2, 3, 4)


def lcp_length(a, b) -> int:
    n = 0
    while n < min(len(a), len(b)) and a[n] == b[n]:
        n += 1
    return n


def match_k(x, y, k: int) -> int:
    """#Match-k (Ouroboros eq. 7): positions i where x_{i..i+k-1} = y_{i..i+k-1}."""
    n = min(len(x), len(y))
    return sum(1 for i in range(n - k + 1) if list(x[i:i + k]) == list(y[i:i + k]))


def inspirations(d, d_hat, l_d: int, beta: int) -> list[list[int]]:
    """Phrases d̂_{i..i+β-1} for runs d_{i..i+β-2} = d̂_{i..i+β-2} after the first mismatch (0-based k = i-1).

    d: the sentence draft d_1..d_m; d_hat: the target's tokens at the same positions plus one (m+1).
    """
    m = len(d)
    return [list(d_hat[k:k + beta]) for k in range(l_d + 1, m - beta + 2)
            if list(d[k:k + beta - 1]) == list(d_hat[k:k + beta - 1])]


class Ouroboros(PooledMethod):
    needs_draft = True

    def __init__(self, pair, name: str = "ouroboros", gamma: int = 4, window: int = 8, beta: int = 4, top_k: int = 3,
                 draft_window: int | None = None, phrase_draft: bool = True, candidate_suffixes: bool = True,
                 inspiration: bool = True, refinement: bool = True, warm_start: bool = False,
                 pool_from_prompt: bool = False, match_stats: bool = False,
                 temperature: float = 0.0, top_p: float = 1.0, seed: int = 0):
        super().__init__(pair, name, temperature, top_p, seed)
        greedy_only(name, temperature)
        self.gamma = positive_int(gamma, "method.gamma", "sentence draft length γ")
        self.window = positive_int(window, "method.window", "W, pool phrases per first token")
        self.beta = positive_int(beta, "method.beta", "phrase length β")
        require(self.beta >= 2, "method.beta", f"must be >= 2, got {beta}")
        self.top_k = positive_int(top_k, "method.top_k", "K, candidate suffixes verified per step")
        self.draft_window = optional_positive(draft_window, "method.draft_window",
                                              "columns of the draft's Jacobi window (null: W)") or self.window
        require(not refinement or candidate_suffixes, "method.refinement",
                "needs candidate_suffixes=true (refinement replaces verified suffixes)")
        self.phrase_draft, self.candidate_suffixes = bool(phrase_draft), bool(candidate_suffixes)
        self.inspiration, self.refinement = bool(inspiration), bool(refinement)
        self.warm_start, self.pool_from_prompt = bool(warm_start), bool(pool_from_prompt)
        self.match_stats = bool(match_stats)
        self.pool = NGramPool(self.beta, capacity=self.window)

    def generate(self, prompt_ids, max_new_tokens, eos_ids, timeline=NoTimeline()) -> Generation:
        target, draft = CachedLM(self.pair.target), draft_lm(self.pair)
        seq = list(prompt_ids)  # committed tokens; the target's cache holds seq[:-1] after the first step
        if self.pool_from_prompt:
            self.pool.insert_all(seq)
        window = (JacobiWindow(self.draft_window, self.beta, seq, random.Random(self.sampler.seed))
                  if self.phrase_draft else None)
        self.draft_seq: list[int] = []  # tokens held by the draft's cache
        gen = Generation(tokens=[])
        ex = {key: [] for key in ("sentence_draft_len", "draft_accepted", "suffix_won", "suffix_accepted", "pool_size")}
        ex.update(draft_phrase_steps=0, draft_pool_hits=0, suffix_tokens=0, inspirations=0, refinements=0)
        if self.match_stats:
            ex.update(lcp=[], match_k={k: [] for k in MATCH_K})
        out: list[int] = []
        while not is_finished(out, max_new_tokens, eos_ids):
            limit = max_new_tokens - len(out) - 1  # draft tokens the budget can still use (the step adds one)
            d = self._sentence_draft(draft, seq, window, limit, eos_ids, ex)
            emitted, suffix_nodes = self._verify(target, seq, d, limit - len(d), ex)
            timeline.mark("prefill")  # first call only
            gen.drafted += len(d) + suffix_nodes
            gen.add_step(out, emitted, len(emitted) - 1, max_new_tokens, eos_ids)
            seq += emitted
            out += emitted
            keep = min(lcp_length(self.draft_seq, seq), len(seq) - 1)
            draft.crop(keep)
            self.draft_seq = self.draft_seq[:keep]
            ex["pool_size"].append(len(self.pool))
        gen.tokens = finalize_tokens(out, max_new_tokens, eos_ids)
        gen.count_forwards(target, draft)
        gen.extra = ex
        return gen

    # (a) sentence draft ---------------------------------------------------------------------
    def _sentence_draft(self, draft: CachedLM, seq, window, limit: int, eos_ids, ex) -> list[int]:
        """d_1..d_m with m >= γ (phrases may overshoot), cut to the ``limit`` the budget can use."""
        d: list[int] = []
        while len(d) < min(self.gamma, limit) and not any(t in eos_ids for t in d):
            pending = (seq + d)[len(self.draft_seq):]  # tokens the draft has not read (>= 1)
            if self.phrase_draft:
                step = lookahead_step(draft, pending, window, self.pool, None)
                self.draft_seq += pending + step.accepted
                d += step.accepted + [step.next_token]
                ex["draft_phrase_steps"] += 1
                ex["draft_pool_hits"] += bool(step.accepted)
            else:
                token = int(draft.forward(pending, keep_last=1)[-1].argmax())
                self.draft_seq += pending
                d.append(token)
        return d[:max(limit, 0)]

    # (b)+(c) synthetic verification, (d) inspiration, (e) refinement ---------------------------
    def _verify(self, target: CachedLM, seq, d: list[int], room: int, ex) -> tuple[list[int], int]:
        """One target forward over the sentence draft and the suffixes (cut to the ``room`` the budget leaves
        after d); returns (emitted tokens, suffix nodes fed)."""
        tokens, parents = chain(seq[target.length:])  # the prompt on the first step, else x_n
        root = len(tokens) - 1
        children: dict[int, list[int]] = {}
        (draft_nodes,) = add_trie(tokens, parents, children, root, [d])  # the sentence draft: a chain under the root
        last = draft_nodes[-1] if d else root  # d_m (or the root when d is empty)
        suffixes = self.pool.newest(tokens[last], self.top_k) if self.candidate_suffixes and room > 0 else []
        suffixes = [suffix[:room] for suffix in suffixes]
        suffix_nodes = add_trie(tokens, parents, children, last, suffixes)
        fed_suffix = len(tokens) - (last + 1)
        ex["suffix_tokens"] += fed_suffix
        past = target.length
        argmax = tree_argmax(target, tokens, parents, root)
        path, next_token = verify_tree_greedy(tokens, children, argmax, root=root)
        target.keep_positions(list(range(past + root + 1)) + [past + n for n in path])

        l_d = sum(1 for n in path if n <= last)
        l_c = len(path) - l_d
        d_hat = argmax[root:last + 1]  # d̂_1..d̂_{m+1}: the target's token at each draft position
        won = -1
        if l_c:
            won = next(i for i, nodes in enumerate(suffix_nodes) if nodes[:l_c] == path[l_d:])
        ex["sentence_draft_len"].append(len(d))
        ex["draft_accepted"].append(l_d)
        ex["suffix_won"].append(won)
        ex["suffix_accepted"].append(l_c)
        if l_d < len(d):
            if self.inspiration:
                for phrase in inspirations(d, d_hat, l_d, self.beta):
                    ex["inspirations"] += self.pool.insert(phrase)
            if self.match_stats:
                ex["lcp"].append(l_d)
                for k in MATCH_K:
                    ex["match_k"][k].append(match_k(d[l_d + 1:], d_hat[l_d + 1:len(d)], k))
        if self.refinement:
            for suffix, nodes in zip(suffixes, suffix_nodes):
                if len(suffix) < self.beta - 1:  # cut by the budget: not the pool's phrase
                    continue
                refined = [argmax[parents[n]] for n in nodes]  # the target's token at each suffix position
                if tuple(refined) != tuple(suffix):
                    self.pool.replace(tokens[last], suffix, refined)
                    ex["refinements"] += 1
        return [tokens[n] for n in path] + [next_token], fed_suffix
