"""Speculative decoding (Leviathan et al. 2023; Chen et al. 2023) with a separate draft model.

Each step: the draft proposes γ tokens autoregressively, the target scores all of them in ONE
forward (the first step's forward also reads the prompt: prefill and verification share it), and
the verifier keeps the longest acceptable prefix and adds the target's own next token.
Greedy verification at temperature 0 (output identical to greedy), rejection sampling above it
(output distributed exactly as the target's).

The number of tokens drafted per step (the speculation lookahead, SL) is decided by a policy
(``method.policy``, sl_policies.py: static γ by default, dynHeur, confidence ...) through
``draft_length``/``keep_drafting``; adaptive policies learn in ``observe``.
"""
from __future__ import annotations

import torch

from ..decoding.cached_lm import CachedLM, draft_lm
from ..decoding.generation import Generation, finalize_tokens, is_finished
from ..decoding.verify import verify_greedy, verify_rejection
from ..errors import require
from .base import DecodingMethod, NoTimeline, positive_int
from .sl_policies import StaticSL


class SpeculativeDecoding(DecodingMethod):
    needs_draft = True

    def __init__(self, pair, name: str, gamma: int = 4, policy=None, **sampling):
        """gamma: the static SL used when no ``policy`` is given (a policy decides the SL itself)."""
        super().__init__(pair, name, **sampling)
        self.gamma = positive_int(gamma, "method.gamma", "draft tokens per step, γ")
        self.policy = policy if policy is not None else StaticSL(self.gamma)
        require(self.sampler.greedy or not getattr(self.policy, "greedy_only", False), "sampling.temperature",
                f"method '{name}' uses {type(self.policy).__name__}, which supports temperature 0 only, "
                f"got {self.sampler.temperature:g}")

    def reset(self, seed: int = 0) -> None:
        super().reset(seed)
        self.policy.reset()

    @property
    def carries_state(self) -> bool:
        return self.policy.carries_state

    def carried_state(self):
        return self.policy.carried_state()

    def restore_state(self, state) -> None:
        self.policy.restore_state(state)

    # -- speculation-lookahead policy hooks --------------------------------------------------
    def draft_length(self) -> int:
        """Upper bound on tokens to draft this step."""
        return self.policy.draft_length()

    def keep_drafting(self, position: int, draft_logits: torch.Tensor, token: int) -> bool:
        """Called after each drafted token (position 1.., the token drafted); False stops the draft early."""
        return self.policy.keep_drafting(position, draft_logits, token)

    def prepare(self, prompt_ids, max_new_tokens: int, eos_ids: set[int]) -> None:
        """Untimed, before each generation: only an oracle policy uses it (to learn the target's output)."""
        self.policy.prepare(self, prompt_ids, max_new_tokens, eos_ids)

    def observe(self, accepted: int, drafted: int) -> None:
        """Feedback after each verification step: ``accepted`` draft tokens kept in the output (a step cut at an
        EOS counts up to it, as transformers' ``num_matches``) of the ``drafted`` ones."""
        self.policy.observe(accepted, drafted)

    # -- the loop ----------------------------------------------------------------------------
    def generate(self, prompt_ids, max_new_tokens, eos_ids, timeline=NoTimeline()) -> Generation:
        target, draft = CachedLM(self.pair.target), draft_lm(self.pair)
        gen = Generation(tokens=[])
        tokens = list(prompt_ids)  # committed sequence; after each step the target's cache holds tokens[:-1]
        out: list[int] = []
        sl: list[int] = []  # tokens drafted per step (the SL actually used)

        while not is_finished(out, max_new_tokens, eos_ids):
            # 1. Draft up to γ tokens, never more than the budget can use (the step adds one more).
            #    The first step's draft forward reads the whole prompt (the draft's prefill).
            self.policy.begin_step(len(out))
            limit = min(self.draft_length(), max_new_tokens - len(out) - 1)
            proposal, draft_probs = self._draft(draft, tokens, limit, eos_ids)

            # 2. Verify: one target forward over what it has not read (the whole prompt on the first
            #    step, so prefill and the first verification share a forward) + d_1..d_γ -> (γ+1, V).
            target_logits = target.forward(tokens[target.length:] + proposal, keep_last=len(proposal) + 1)
            timeline.mark("prefill")  # first call only: time to the first new token
            if self.sampler.greedy:
                n, next_token = verify_greedy(proposal, target_logits)
            else:
                target_probs = self.sampler.probs(target_logits)
                n, next_token = verify_rejection(proposal, draft_probs, target_probs, self.sampler)

            # 3. Commit d_1..d_n + next; drop rejected positions from both caches.
            emitted = proposal[:n] + [next_token]
            gen.drafted += len(proposal)
            gen.add_step(out, emitted, n, max_new_tokens, eos_ids)
            tokens += emitted
            out += emitted
            target.crop(len(tokens) - 1)
            draft.crop(min(draft.length, len(tokens) - 1))
            self.observe(gen.accept_lengths[-1] - 1, len(proposal))  # matches kept (cut at EOS), as transformers
            sl.append(len(proposal))

        gen.tokens = finalize_tokens(out, max_new_tokens, eos_ids)
        gen.extra["sl"] = sl
        gen.count_forwards(target, draft)
        return gen

    def _draft(self, draft: CachedLM, tokens: list[int], limit: int, eos_ids: set[int]):
        """Draft up to ``limit`` tokens after ``tokens``; returns (d_1..d_k, q as (k, V) or None)."""
        proposal: list[int] = []
        probs: list[torch.Tensor] = []
        feed = tokens[draft.length:]  # committed tokens the draft has not read yet
        while len(proposal) < limit:
            logits = draft.forward(feed, keep_last=1)[-1]
            token, q = self.sampler.pick(logits)
            proposal.append(token)
            probs.append(q)
            feed = [token]
            if token in eos_ids or not self.keep_drafting(len(proposal), logits, token):
                break
        draft_probs = torch.stack(probs) if probs and probs[0] is not None else None
        return proposal, draft_probs
