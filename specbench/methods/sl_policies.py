"""Speculation-lookahead (SL, γ) policies: how many tokens the draft proposes at each step (DISCO §2-4).

A policy is one pluggable piece of ``SpeculativeDecoding`` (``method.policy``), never a copy of its loop:
``begin_step(n)`` opens a step after n committed new tokens, ``draft_length()`` bounds the next draft,
``keep_drafting(i, logits, token)`` may stop it after the i-th drafted token, ``observe(accepted, drafted)``
learns from each verification, ``reset()`` runs before every prompt, and ``prepare(...)`` runs untimed
before each generation (only the oracle uses it).
The verification is unchanged, so every policy emits exactly greedy's tokens at temperature 0.
"""
from __future__ import annotations

import math

import torch

from ..errors import require
from ..errors import positive_int


class StaticSL:
    """static SL-k: always draft γ tokens (Leviathan et al.; Chen et al.)."""

    @property
    def longest_draft(self) -> int | None:
        """The most tokens one step drafts (γ, SL_max); None: unbounded."""
        return self.gamma

    def __init__(self, gamma: int = 5):
        self.gamma = positive_int(gamma, "method.policy.gamma", "draft tokens per step, γ")
        self.committed = 0  # new tokens committed before the current step

    carries_state = False  # True: the SL learnt on one prompt starts the next (see DecodingMethod.carries_state)

    def reset(self) -> None:
        pass

    def carried_state(self):
        return None

    def restore_state(self, state) -> None:
        pass

    def prepare(self, method, prompt_ids, max_new_tokens: int, eos_ids: set[int]) -> None:
        pass

    def begin_step(self, committed: int) -> None:
        self.committed = committed

    def output_index(self, position: int) -> int:
        """Where the step's ``position``-th drafted token (1-based) would sit in the generated output."""
        return self.committed + position - 1

    def draft_length(self) -> int:
        return self.gamma

    def keep_drafting(self, position: int, draft_logits: torch.Tensor, token: int) -> bool:
        return True

    @property
    def stops_early(self) -> bool:
        """Whether ``keep_drafting`` can stop a draft (it reads each drafted token: one host read per token)."""
        return type(self).keep_drafting is not StaticSL.keep_drafting

    def observe(self, accepted: int, drafted: int) -> None:
        pass


class HeuristicSL(StaticSL):
    """dynHeur (Gante 2023; transformers' ``num_assistant_tokens_schedule``): +2 after a step whose drafts
    were all accepted, -1 otherwise, never below 1. ``persistent``: the SL carries over from prompt to
    prompt (transformers' ``heuristic``); otherwise it restarts at ``initial`` (``heuristic_transient``).
    Exactly transformers' rule (``update_candidate_strategy``, 5.x): "all accepted" compares the matches kept
    after an EOS cut with the candidates drafted, so a step that drafted nothing (one token of budget left)
    counts as all accepted (+2), and one whose accepted drafts end in an EOS before the last draft as not (-1)."""

    def __init__(self, initial: int = 5, increase: int = 2, decrease: int = 1, minimum: int = 1,
                 persistent: bool = True):
        super().__init__(initial)
        self.initial = self.gamma
        self.increase, self.decrease = increase, decrease
        self.minimum = positive_int(minimum, "method.policy.minimum", "smallest SL")
        self.persistent = bool(persistent)

    def reset(self) -> None:
        if not self.persistent:
            self.gamma = self.initial

    @property
    def longest_draft(self) -> None:
        return None  # +2 per fully accepted step, without a ceiling

    @property
    def carries_state(self) -> bool:
        return self.persistent

    def carried_state(self) -> int:
        return self.gamma

    def restore_state(self, state) -> None:
        self.gamma = self.initial if state is None else state

    def observe(self, accepted: int, drafted: int) -> None:
        if accepted == drafted:
            self.gamma += self.increase
        else:
            self.gamma = max(self.minimum, self.gamma - self.decrease)


class ConfidenceSL(StaticSL):
    """Stop drafting once the draft's top probability falls below ``threshold`` (transformers'
    ``assistant_confidence_threshold``), drafting at most ``sl_max`` tokens."""

    def __init__(self, threshold: float = 0.4, sl_max: int = 20):
        super().__init__(sl_max)
        require(isinstance(threshold, (int, float)) and 0 <= threshold <= 1, "method.policy.threshold",
                f"must be a probability in [0, 1], got {threshold!r}")
        self.threshold = float(threshold)

    def keep_drafting(self, position: int, draft_logits: torch.Tensor, token: int) -> bool:
        return float(torch.softmax(draft_logits.float(), dim=-1).max()) >= self.threshold


class PerplexitySL(StaticSL):
    """DISCO's rule-based baseline (its Table 2, "ppl SL-opt"): the perplexity of this step's draft so far,
    exp(-mean log q(d_j)) over the tokens drafted in the step, measures the draft's confidence; drafting
    stops once it exceeds ``threshold`` (tuned on validation), at most ``sl_max`` tokens."""

    def __init__(self, threshold: float = 2.0, sl_max: int = 20):
        super().__init__(sl_max)
        require(isinstance(threshold, (int, float)) and threshold >= 1, "method.policy.threshold",
                f"must be a perplexity >= 1, got {threshold!r}")
        self.threshold = float(threshold)
        self.log_prob_sum = 0.0

    def begin_step(self, committed: int) -> None:
        super().begin_step(committed)
        self.log_prob_sum = 0.0

    def keep_drafting(self, position: int, draft_logits: torch.Tensor, token: int) -> bool:
        self.log_prob_sum += float(torch.log_softmax(draft_logits.float(), dim=-1)[token])
        return math.exp(-self.log_prob_sum / position) <= self.threshold


class OracleSL(StaticSL):
    """The oracle SL (DISCO §2): each step drafts exactly the run of tokens the target will accept, possibly
    none. ``prepare`` (untimed, before the generation; an oracle, a lower bound on latency, not a usable
    method) computes the target's greedy output y and, reading the prompt and y in one draft forward, the
    draft's greedy token after every prefix of y. At temperature 0 the committed output is always a prefix of
    y, so a step starting after c tokens drafts the draft's tokens as long as they equal y_c, y_c+1, ...:
    the oracle SL is the length of that agreeing run (at most ``sl_max``), and no rejected token is ever
    drafted. The per-step SL sequence is the record's ``extra.sl``."""

    greedy_only = True  # its oracle is greedy's output: SpeculativeDecoding refuses it at temperature > 0

    def __init__(self, sl_max: int = 64):
        super().__init__(sl_max)
        self.agreeing: list[int] = []  # agreeing[c]: how many draft tokens from output position c on equal y's

    def prepare(self, method, prompt_ids, max_new_tokens: int, eos_ids: set[int]) -> None:
        from ..backends.torch.cached_lm import draft_lm
        from .greedy import Greedy

        y = Greedy(method.pair, "oracle-reference").generate(prompt_ids, max_new_tokens, eos_ids).tokens
        self.agreeing = [0] * (len(y) + 1)
        if not y:
            return
        # (|y|, V) logits: row i predicts the token after prompt + y_0..y_{i-1}
        logits = draft_lm(method.pair).forward(list(prompt_ids) + y[:-1], keep_last=len(y))
        draft_tokens = logits.argmax(dim=-1).tolist()
        for c in range(len(y) - 1, -1, -1):
            self.agreeing[c] = self.agreeing[c + 1] + 1 if draft_tokens[c] == y[c] else 0

    def draft_length(self) -> int:
        c = self.committed
        return min(self.gamma, self.agreeing[c] if c < len(self.agreeing) else 0)
