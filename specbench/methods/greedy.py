"""Plain autoregressive decoding with the target alone: the baseline every speedup is measured against.

Our own loop over a KV cache (no ``generate()``), one target forward per token. At temperature > 0
it samples from the same processed distribution the speculative methods preserve.
"""
from __future__ import annotations

from ..decoding.evidence import evidence_of
from ..decoding.generation import Generation, finalize_tokens, is_finished
from .base import DecodingMethod, NoTimeline


class Greedy(DecodingMethod):
    def generate(self, prompt_ids, max_new_tokens, eos_ids, timeline=NoTimeline()) -> Generation:
        target = self.pair.lm("target")
        logits = target.forward(prompt_ids, keep_last=1)[-1]  # (V,)
        timeline.mark("prefill")
        out: list[int] = []
        evidence = []  # at T = 0, each token's one-token row (evidence.py): what the losslessness check weighs
        while True:
            token, _ = self.sampler.pick(logits)
            out.append(token)
            if self.sampler.greedy:
                evidence += evidence_of(logits[None], [token], len(prompt_ids) if len(out) == 1 else 1)
            timeline.step()  # one step per token: the clock reads each token's time (analysis/identical_work.py)
            if is_finished(out, max_new_tokens, eos_ids):
                break
            logits = target.forward([token])[-1]
        tokens = finalize_tokens(out, max_new_tokens, eos_ids)
        # one token per target forward (τ = 1), nothing proposed (no α_k)
        gen = Generation(tokens=tokens, accept_lengths=[1] * len(tokens), proposed=[0] * len(tokens),
                         accepted_steps=[0] * len(tokens), evidence=evidence[:len(tokens)])
        gen.count_forwards(target)
        return gen
