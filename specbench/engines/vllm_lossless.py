"""Identical to greedy, near-tie or MISMATCH, for engine=vllm: lossless.py's rule with vLLM's own numbers.

vLLM decodes one token per step (greedy) or verifies blocks (speculation) with kernels of its own, so the
noise δ and the gap at a divergence are measured on the engine that decoded, not on transformers: δ = the
largest |log p| difference between greedy's one-token decode steps (``logprobs``) and a prefill of the same
sequence (``prompt_logprobs``), over the top-20 tokens of 2 prompts x 32 positions; at a divergence the gap is
log p(g) - log p(m) recomputed by prefill after the common prefix (log-probabilities differ from logits by the
same normaliser for g and m, so the gap is the logit gap). A gap within 4δ is a near-tie (lossless.py explains
the 4), above it a MISMATCH. The calibration is cached per engine settings, model files and vLLM version.
"""
from __future__ import annotations

import hashlib
import json
import sys
from dataclasses import asdict

from ..lossless import (CALIBRATION_TEXTS, IDENTICAL, MISMATCH, NEAR_TIE, TOLERANCE_FACTOR, NoiseProfile,
                        first_difference)
from ..records import write_json

TOP = 20  # logprobs per position compared (vLLM's default max_logprobs)


def measure_noise(session, prompts: list[list[int]], positions: int = 32) -> NoiseProfile:
    from vllm import SamplingParams

    worst = 0.0
    for prompt in prompts:
        params = SamplingParams(temperature=0.0, max_tokens=positions, logprobs=TOP, detokenize=False)
        (decoded,) = session.llm.generate([{"prompt_token_ids": prompt}], params, use_tqdm=False)
        tokens = list(decoded.outputs[0].token_ids)
        steps = decoded.outputs[0].logprobs  # per new token: {token: Logprob} of that decode step
        prefill_params = SamplingParams(max_tokens=1, prompt_logprobs=TOP, detokenize=False)
        (prefilled,) = session.llm.generate([{"prompt_token_ids": prompt + tokens}], prefill_params, use_tqdm=False)
        blocks = prefilled.prompt_logprobs[len(prompt):]  # position i: the distribution token i was drawn from
        for step, block in zip(steps, blocks):
            for token in step.keys() & block.keys():
                worst = max(worst, abs(step[token].logprob - block[token].logprob))
    return NoiseProfile(max_abs_diff=worst, per_block={"decode-vs-prefill": worst}, positions=positions * len(prompts))


class VllmLosslessCheck:
    """``classify(prompt, greedy_ids, method_ids)`` as lossless.LosslessCheck, on the no-speculation engine."""

    def __init__(self, session, codec, identity: dict):
        self.session, self.codec, self.identity = session, codec, identity
        self._profile: NoiseProfile | None = None

    @property
    def profile(self) -> NoiseProfile:
        if self._profile is None:
            from ..models.files import cache_root

            digest = hashlib.sha1(json.dumps(self.identity, sort_keys=True, default=str).encode()).hexdigest()[:16]
            path = cache_root() / "noise" / f"vllm-{digest}.json"
            if path.exists():
                self._profile = NoiseProfile(**json.loads(path.read_text()))
            else:
                print("[specbench] measuring vLLM's log-probability noise between decode steps and prefill; once "
                      "per engine settings and model", file=sys.stderr)
                prompts = [self.codec.encode(text, chat=False) for text in CALIBRATION_TEXTS]
                self._profile = measure_noise(self.session, prompts)
                write_json(path, asdict(self._profile))
        return self._profile

    def classify(self, prompt_ids: list[int], greedy_ids: list[int], method_ids: list[int]) -> dict:
        result = first_difference(greedy_ids, method_ids)
        if result["verdict"] == IDENTICAL or "reason" in result:
            return result
        d, g, m = result["index"], result["greedy_token"], result["method_token"]
        prefix = list(prompt_ids) + list(greedy_ids[:d])
        lp_g, lp_m = self.session.prompt_logprobs([prefix + [g], prefix + [m]])
        tolerance = TOLERANCE_FACTOR * self.profile.max_abs_diff
        gap = lp_g - lp_m
        result.update(gap_prefill=gap, noise_calibrated=self.profile.max_abs_diff, tolerance=tolerance,
                      verdict=NEAR_TIE if gap <= tolerance else MISMATCH)
        return result
