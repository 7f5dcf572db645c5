"""Speculative decoding (Leviathan et al. 2023; Chen et al. 2023) with a separate draft model.

Each step: the draft proposes up to γ tokens autoregressively (``DraftChain``, a proposer), the target
scores all of them in ONE forward (the first step's forward also reads the prompt: prefill and
verification share it), and the verifier keeps the longest acceptable prefix and adds the target's own
next token (decoding/loop.py). Greedy verification at temperature 0 (output identical to greedy),
rejection sampling with the draft's q above it (output distributed exactly as the target's).

The number of tokens drafted per step (the speculation lookahead, SL) is decided by a policy
(``method.policy``, sl_policies.py: static γ by default, dynHeur, confidence, DISCO ...) through
``draft_length``/``keep_drafting``; adaptive policies learn in ``observe``.
"""
from __future__ import annotations

from typing import Literal

import torch

from ..analysis.autotune import LONGEST
from ..backends.torch.cached_lm import CachedLM, draft_lm
from ..decoding.proposal import Proposal, Step, StepContext
from ..errors import require
from ..backends.execution import EAGER
from .base import ProposerMethod, length_or_auto
from .sl_policies import StaticSL


class DraftChain:
    """Proposer: the draft model's tokens d_1..d_k, one draft forward each, k decided by the SL policy.

    The draft's cache holds committed tokens only between steps: after verification it is cropped to the
    committed sequence (less the last token, which the next step feeds with any others it has not read).

    Under a policy that decides k before the step (static γ, dynHeur, the oracle) the chain stays on the device:
    each draft token (the argmax at T = 0, a sample from q drawn on the device above it) is fed to the next draft
    forward as a tensor, and the verify step reads the drafts together with the target's argmax: at T = 0 one host
    read per step (on a GPU, one sync); at T > 0 two more, the rejection test's p and q at every draft and the token
    sampled after it (verify.verify_tree_sampling). Nothing is read while drafting, so the draft does not stop at an
    EOS: a last step may draft past one, which verification and the output's EOS cut make harmless (``drafted``
    counts what was fed; the policy learns from the draft as cut at its first EOS, transformers' count). Policies
    that judge each token (confidence, perplexity, DISCO) read every drafted token."""

    def __init__(self, draft: CachedLM, policy):
        self.draft, self.policy = draft, policy
        self.sl: list[int] = []  # tokens drafted per step (the SL actually used)
        self.eos_ids: set[int] = set()

    def propose(self, context: StepContext) -> Proposal:
        self.policy.begin_step(context.new_tokens)
        self.eos_ids = context.eos_ids
        limit = min(self.policy.draft_length(), context.room)
        if limit > 0 and not self.policy.stops_early:
            return self._propose_on_device(context.tokens[self.draft.length:], limit, context.sampler)
        tokens: list[int] = []
        probs: list[torch.Tensor] = []
        feed = context.tokens[self.draft.length:]  # committed tokens the draft has not read (the prompt first)
        while len(tokens) < limit:
            logits = self.draft.forward(feed, keep_last=1)[-1]
            token, q = context.sampler.pick(logits)
            tokens.append(token)
            probs.append(q)
            feed = [token]
            if token in context.eos_ids or not self.policy.keep_drafting(len(tokens), logits, token):
                break
        return Proposal.chain(tokens, torch.stack(probs) if probs and probs[0] is not None else None)

    def _propose_on_device(self, feed: list[int], limit: int, sampler) -> Proposal:
        """``limit`` drafts, each fed back as a (1,) tensor: nothing read (class docstring). At T > 0 each is drawn
        from its q (the sampler's distribution of the draft's logits) on the device, q kept for the verify."""
        tokens: list[torch.Tensor] = []
        probs: list[torch.Tensor] = []  # (1, V) q per draft, T > 0 only
        ids: list[int] | torch.Tensor = feed  # committed tokens the draft has not read, then each draft
        for _ in range(limit):
            logits = self.draft.forward(ids, keep_last=1)[-1:]  # (1, V)
            if sampler.greedy:
                ids = logits[0].argmax(dim=-1, keepdim=True)  # (1,)
            else:
                probs.append(sampler.probs(logits))
                ids = sampler.sample_ids(probs[-1])  # (1,)
            tokens.append(ids)
        return Proposal.chain_on_device(torch.cat(tokens), torch.cat(probs) if probs else None)  # (limit,)

    def observe(self, step: Step) -> None:
        self.draft.crop(min(self.draft.length, len(step.tokens) - 1))
        drafted = step.proposal.tokens
        until_eos = next((i + 1 for i, token in enumerate(drafted) if token in self.eos_ids), len(drafted))
        # matches kept (cut at an EOS, as transformers' num_matches) of the tokens drafted up to an EOS
        self.policy.observe(step.kept - 1, until_eos)
        self.sl.append(len(drafted))

    def extra(self) -> dict:
        return {"sl": self.sl}


class SpeculativeDecoding(ProposerMethod):
    needs_draft = True

    def __init__(self, pair, name: str, gamma: int | Literal["auto"] = 4, policy=None, **sampling):
        """gamma: the static SL used when no ``policy`` is given (a policy decides the SL itself); ``auto``: chosen
        before timing from this machine's forward costs and the warm-up prompt's acceptance (analysis/autotune.py)."""
        super().__init__(pair, name, **sampling)
        fixed = length_or_auto(gamma, "method.gamma", "draft tokens per step, γ")
        require(fixed is not None or policy is None, "method.gamma",
                f"auto chooses a static γ; method '{name}' has a policy ({type(policy).__name__}) deciding it")
        self.tunes_length = fixed is None
        self.gamma = fixed if fixed is not None else LONGEST
        self.policy = policy if policy is not None else StaticSL(self.gamma)
        if hasattr(self.policy, "use_execution"):  # a policy that runs a network of its own (DISCO's classifier)
            self.policy.use_execution(getattr(pair, "execution", EAGER))
        require(self.sampler.greedy or not getattr(self.policy, "greedy_only", False), "sampling.temperature",
                f"method '{name}' uses {type(self.policy).__name__}, which supports temperature 0 only, "
                f"got {self.sampler.temperature:g}")

    def reset(self, seed: int = 0) -> None:
        super().reset(seed)
        self.policy.reset()

    def set_proposal_length(self, length: int) -> None:
        self.gamma, self.policy = length, StaticSL(length)

    def step_blocks(self) -> dict[str, int]:
        bound = getattr(self.policy, "longest_draft", None)  # None: a policy whose SL grows without bound
        return {} if bound is None else {"target": bound + 1}

    @property
    def carries_state(self) -> bool:
        return self.policy.carries_state

    def carried_state(self):
        return self.policy.carried_state()

    def restore_state(self, state) -> None:
        self.policy.restore_state(state)

    def prepare(self, prompt_ids, max_new_tokens: int, eos_ids: set[int]) -> None:
        """Untimed, before each generation: only an oracle policy uses it (to learn the target's output)."""
        self.policy.prepare(self, prompt_ids, max_new_tokens, eos_ids)

    def make_proposer(self, prompt_ids) -> DraftChain:
        return DraftChain(draft_lm(self.pair), self.policy)
