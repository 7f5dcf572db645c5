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
exactly greedy's: only the target's argmax decides what is emitted. At temperature > 0 the same tree is
verified by recursive rejection sampling (d and the suffixes are deterministic, point-mass proposals), so
the output is distributed exactly as the target's; drafting and the pool keep using argmax tokens.
The method is a proposer (``OuroborosProposer``) plus config; the loop is decoding/loop.py.

Raw counters: drafted = guess tokens fed to the target (|d| + suffix trie nodes), accepted = tokens of d
accepted + suffix tokens accepted; extra: per-step lists sentence_draft_len, draft_accepted (l_d),
suffix_won (index into the K suffixes, -1 none), suffix_accepted (l_c), pool_size; totals
draft_phrase_steps, draft_pool_hits (draft steps that accepted a pooled phrase), suffix_tokens,
inspirations (new phrases), refinements (suffixes changed); with ``match_stats`` the Table 1 numbers per
rejected step: lcp (l_d) and match_k[k] (#Match-k of the discarded d_{l_d+2..} vs d̂_{l_d+2..}).
"""
from __future__ import annotations

import random
from dataclasses import asdict, dataclass, field

from ..backends.torch.cached_lm import CachedLM, draft_lm
from ..decoding.jacobi import JacobiWindow, lookahead_step
from ..decoding.ngram_pool import NGramPool
from ..decoding.proposal import Proposal, Step, StepContext
from ..errors import require
from ..errors import positive_int
from .lookahead import PooledMethod

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


@dataclass
class OuroborosCounters:
    """Raw counters of one generation (the record's ``extra``; the module docstring says what each is)."""

    sentence_draft_len: list[int] = field(default_factory=list)  # per step: |d|
    draft_accepted: list[int] = field(default_factory=list)  # per step: l_d
    suffix_won: list[int] = field(default_factory=list)  # per step: index of the accepted suffix, -1 none
    suffix_accepted: list[int] = field(default_factory=list)  # per step: l_c
    pool_size: list[int] = field(default_factory=list)  # per step: phrases in the pool after it
    draft_phrase_steps: int = 0  # draft lookahead steps
    draft_pool_hits: int = 0  # of those, steps that accepted a pooled phrase
    suffix_tokens: int = 0  # suffix trie nodes fed to the target
    inspirations: int = 0  # phrases new to the pool from (d)
    refinements: int = 0  # suffixes replaced by (e)


@dataclass
class MatchStats:
    """Table 1 statistics per rejected step (``match_stats``): l_d and #Match-k of the discarded draft."""

    lcp: list[int] = field(default_factory=list)
    match_k: dict[int, list[int]] = field(default_factory=lambda: {k: [] for k in MATCH_K})


class Ouroboros(PooledMethod):
    needs_draft = True

    def __init__(self, pair, name: str = "ouroboros", gamma: int = 4, window: int = 8, beta: int = 4, top_k: int = 3,
                 draft_window: int | None = None, phrase_draft: bool = True, candidate_suffixes: bool = True,
                 inspiration: bool = True, refinement: bool = True, warm_start: bool = False,
                 pool_from_prompt: bool = False, match_stats: bool = False,
                 temperature: float = 0.0, top_p: float = 1.0, seed: int = 0):
        super().__init__(pair, name, temperature, top_p, seed)
        self.gamma = positive_int(gamma, "method.gamma", "sentence draft length γ")
        self.window = positive_int(window, "method.window", "W, pool phrases per first token")
        self.beta = positive_int(beta, "method.beta", "phrase length β")
        require(self.beta >= 2, "method.beta", f"must be >= 2, got {beta}")
        self.top_k = positive_int(top_k, "method.top_k", "K, candidate suffixes verified per step")
        self.draft_window = positive_int(draft_window, "method.draft_window",
                                         "columns of the draft's Jacobi window (null: W)", optional=True) or self.window
        require(not refinement or candidate_suffixes, "method.refinement",
                "needs candidate_suffixes=true (refinement replaces verified suffixes)")
        self.phrase_draft, self.candidate_suffixes = bool(phrase_draft), bool(candidate_suffixes)
        self.inspiration, self.refinement = bool(inspiration), bool(refinement)
        self.warm_start, self.pool_from_prompt = bool(warm_start), bool(pool_from_prompt)
        self.match_stats = bool(match_stats)
        self.pool = NGramPool(self.beta, capacity=self.window)

    def step_blocks(self) -> dict[str, int]:
        """x0, the sentence draft (< γ before its last phrase, which adds at most β) and K suffixes of β-1."""
        return {"target": self.gamma + self.beta + self.top_k * (self.beta - 1)}

    def make_proposer(self, prompt_ids) -> "OuroborosProposer":
        if self.pool_from_prompt:
            self.pool.insert_all(list(prompt_ids))
        window = (JacobiWindow(self.draft_window, self.beta, list(prompt_ids), random.Random(self.sampler.seed))
                  if self.phrase_draft else None)
        return OuroborosProposer(self, draft_lm(self.pair), window)


class OuroborosProposer:
    """One generation's proposals: the sentence draft d (a chain from x0) and the K newest pool suffixes for d_m
    hung after it (a trie), all point masses; ``observe`` runs inspiration, refinement and the counters."""

    def __init__(self, config: Ouroboros, draft: CachedLM, window: JacobiWindow | None):
        self.c, self.pool, self.draft, self.window = config, config.pool, draft, window
        self.draft_seq: list[int] = []  # tokens held by the draft's cache
        self.ex = OuroborosCounters()
        self.match_stats = MatchStats() if config.match_stats else None

    def extra(self) -> dict:
        return {**asdict(self.ex), **(asdict(self.match_stats) if self.match_stats else {})}

    # (a) sentence draft ---------------------------------------------------------------------
    def _sentence_draft(self, seq: list[int], limit: int, eos_ids) -> list[int]:
        """d_1..d_m with m >= γ (phrases may overshoot), cut to the ``limit`` the budget can use."""
        d: list[int] = []
        while len(d) < min(self.c.gamma, limit) and not any(t in eos_ids for t in d):
            drafted = seq + d  # the draft's cache holds a prefix of it; it reads the rest (>= 1 token)
            if self.c.phrase_draft:
                step = lookahead_step(self.draft, drafted, self.window, self.pool, None)
                self.draft_seq = drafted[:-1]
                d += step.emitted
                self.ex.draft_phrase_steps += 1
                self.ex.draft_pool_hits += bool(step.path)
            else:
                d.append(int(self.draft.forward(drafted[len(self.draft_seq):], keep_last=1)[-1].argmax()))
                self.draft_seq = drafted
        return d[:max(limit, 0)]

    # (b) candidate suffixes, (c) one tree for the target -----------------------------------------
    def propose(self, context: StepContext) -> Proposal:
        """d as a chain from x0, then the K newest suffixes of P(d_m) (cut to the room the budget leaves after
        d) merged into a trie under d_m; fed with the Figure 2 mask in one target forward."""
        self.d = d = self._sentence_draft(context.tokens, context.room, context.eos_ids)
        proposal = Proposal(fed_as_tree=True)
        proposal.add_paths([d])
        self.key = d[-1] if d else context.tokens[-1]
        room = context.room - len(d)
        suffixes = self.pool.newest(self.key, self.c.top_k) if self.c.candidate_suffixes and room > 0 else []
        self.suffixes = [suffix[:room] for suffix in suffixes]
        self.suffix_nodes = proposal.add_paths(self.suffixes, under=len(d) - 1)  # under d_m (-1: x0, d empty)
        self.ex.suffix_tokens += len(proposal.tokens) - len(d)
        return proposal

    # (d) inspiration, (e) refinement, the draft's cache ------------------------------------------
    def observe(self, step: Step) -> None:
        d, ex, path = self.d, self.ex, step.path
        l_d = sum(1 for n in path if n < len(d))
        l_c = len(path) - l_d
        d_hat = step.argmax[:len(d) + 1]  # d̂_1..d̂_{m+1}: the target's token at each draft position
        won = -1
        if l_c:
            won = next(i for i, nodes in enumerate(self.suffix_nodes) if nodes[:l_c] == path[l_d:])
        ex.sentence_draft_len.append(len(d))
        ex.draft_accepted.append(l_d)
        ex.suffix_won.append(won)
        ex.suffix_accepted.append(l_c)
        if l_d < len(d):
            if self.c.inspiration:
                for phrase in inspirations(d, d_hat, l_d, self.c.beta):
                    ex.inspirations += self.pool.insert(phrase)
            if self.match_stats is not None:
                self.match_stats.lcp.append(l_d)
                for k in MATCH_K:
                    self.match_stats.match_k[k].append(match_k(d[l_d + 1:], d_hat[l_d + 1:len(d)], k))
        if self.c.refinement:
            parents = step.proposal.parents
            for suffix, nodes in zip(self.suffixes, self.suffix_nodes):
                if len(suffix) < self.c.beta - 1:  # cut by the budget: not the pool's phrase
                    continue
                refined = [step.argmax[parents[n] + 1] for n in nodes]  # the target's token at each suffix position
                if tuple(refined) != tuple(suffix):
                    self.pool.replace(self.key, suffix, refined)
                    ex.refinements += 1
        # the draft keeps what it read of the committed sequence (less its last token, read next step)
        seq = step.tokens
        keep = min(lcp_length(self.draft_seq, seq), len(seq) - 1)
        self.draft.crop(keep)
        self.draft_seq = self.draft_seq[:keep]
        ex.pool_size.append(len(self.pool))
