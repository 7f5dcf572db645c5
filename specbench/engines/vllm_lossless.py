"""Identical to greedy, near-tie or MISMATCH, for engine=vllm: analysis/lossless.py's rule with vLLM's own numbers.

vLLM decodes one token per step (greedy) or verifies blocks (speculation) with kernels of its own, so the
noise and the gap at a divergence are measured on the engine that decoded, not on transformers. The noise is
analysis/lossless.py's pair statistic: per position, the largest |Δ(b) - Δ(a)| between greedy's one-token decode step
(``logprobs``) and a prefill of the same sequence (``prompt_logprobs``), a = the emitted token, b = each other
token both report (top-20), over the calibration texts x 32 positions. At a divergence the gap is
log p(g) - log p(m) recomputed by prefill after the common prefix (log-probabilities differ from logits by the
same normaliser for g and m, so the gap is the logit gap). A gap within TOLERANCE_FACTOR x the largest pair
disagreement is a near-tie, above it a MISMATCH. vLLM returns no rows per step, so the per-step checks of
analysis/lossless.py (own forward, agreement over the shared prefix) have nothing to read here: this is the divergence
check alone, with the greedy side's preference recomputed. The calibration is cached per engine settings, model
files, vLLM version and NOISE_VERSION.
"""
from __future__ import annotations

import hashlib
import json
import sys
from dataclasses import asdict

from ..analysis.lossless import (CALIBRATION_TEXTS, IDENTICAL, MISMATCH, NEAR_TIE, NOISE_VERSION, TOLERANCE_FACTOR,
                                 NoiseProfile, first_difference, output_of)
from ..analysis.lossless_rows import PAIR_RANKS
from ..files import write_json

TOP = 20  # logprobs per position compared (vLLM's default max_logprobs)


def measure_noise(session, prompts: list[list[int]], positions: int = 32) -> NoiseProfile:
    """session: ``decode_logprobs(prompt, positions, top)`` and ``prefill_logprobs(sequence, top)`` of the engine
    that decodes (an in-process VllmSession, or a vLLM server's API: engines/serving/vllm_server.py)."""
    worst, worst_pair, samples = 0.0, 0.0, 0
    for prompt in prompts:
        tokens, steps = session.decode_logprobs(prompt, positions, TOP)  # per new token: {token: log p} of its step
        blocks = session.prefill_logprobs(prompt + tokens, TOP)[len(prompt):]  # position i: what token i came from
        for emitted, step, block in zip(tokens, steps, blocks):
            shared = step.keys() & block.keys()
            for token in shared:
                worst = max(worst, abs(step[token] - block[token]))
            if emitted not in shared:
                continue
            delta = {t: block[t] - step[t] for t in shared}  # Δ = prefill - decode step
            others = sorted(shared - {emitted}, key=lambda t: -step[t])[:PAIR_RANKS]
            worst_pair = max([worst_pair] + [abs(delta[t] - delta[emitted]) for t in others])
            samples += 1
    key = "decode-vs-prefill"
    return NoiseProfile(max_abs_diff=worst, per_block={key: worst}, positions=positions * len(prompts),
                        pair_max={key: worst_pair}, pair_samples=samples, version=NOISE_VERSION)


class VllmLosslessCheck:
    """``classify(prompt, greedy, method)`` as lossless.LosslessCheck (turn records, Generations or id lists), on
    the no-speculation engine."""

    def __init__(self, session, codec, identity: dict):
        self.session, self.codec, self.identity = session, codec, identity
        self._profile: NoiseProfile | None = None

    @property
    def profile(self) -> NoiseProfile:
        if self._profile is None:
            from ..files import cache_root

            identity = {**self.identity, "noise_version": NOISE_VERSION}
            digest = hashlib.sha1(json.dumps(identity, sort_keys=True, default=str).encode()).hexdigest()[:16]
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

    def tolerance(self) -> float:
        return TOLERANCE_FACTOR * max(self.profile.pair_max.values())

    def classify(self, prompt_ids: list[int], greedy, method) -> dict:
        greedy_ids, method_ids = output_of(greedy).output_ids, output_of(method).output_ids
        result = first_difference(greedy_ids, method_ids)
        if result["verdict"] == IDENTICAL or "reason" in result:
            return result
        d, g, m = result["index"], result["greedy_token"], result["method_token"]
        prefix = list(prompt_ids) + list(greedy_ids[:d])
        lp_g, lp_m = self.session.prompt_logprobs([prefix + [g], prefix + [m]])
        tolerance = self.tolerance()
        gap = lp_g - lp_m
        result.update(gap=gap, gap_greedy=gap, gap_method=None, exact=False, greedy_row="recomputed",
                      method_row="not recorded", noise_calibrated=max(self.profile.pair_max.values()),
                      tolerance=tolerance, check="divergence", verdict=NEAR_TIE if gap <= tolerance else MISMATCH)
        return result
