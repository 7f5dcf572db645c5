"""Is a divergence from greedy a bug, or rounding at a near-tie? (docs/design.md, *Identical to greedy: near-ties and
mismatches*)

In bf16/fp16 a k-token forward and k one-token forwards sum in different orders, so their logits differ
slightly, and where the target's two best tokens are that close, a correct method can pick the other
one. So at a prompt's first divergence (after the clock stopped) we recompute the target's logits at
that prefix, by a one-token step after a prefill of the rest, and by a 5-token block, and take the **gap**
between greedy's token g and the method's token m on the one-token path: gap = l'(g) - l'(m).

Tolerance, and why: let δ bound |l_a(v) - l_b(v)| for every token v between any two of the ways a prefix
can be fed (token by token as greedy did, in blocks as a method does, prefilled as we recompute). Greedy's
own logits l had l(g) >= l(m). The method chose m on logits l + Δ (|Δ| <= δ), so l(g) - l(m) <= 2δ; and
our recomputation l' is within δ of l for every token, so gap = l'(g) - l'(m) <= l(g) - l(m) + 2δ <= 4δ.
A gap above 4δ cannot come from that noise: **MISMATCH** (a bug). A gap within it is a **near-tie**. δ is
measured, never assumed: the largest |Δ| over every vocabulary entry at every position of a calibration run
(``measure_noise``: 2 prompts x 32 positions fed token by token, and in blocks of 2/4/8/16/32 tokens —
the largest block a method here feeds is lookahead's 31 — causal and tree-masked), and at the divergence
itself; the larger of the two is used. The calibration is cached per (pair, weights, dtype, linear kernel,
threads, torch, device and its name) under ``$SPECBENCH_CACHE/noise/``.
"""
from __future__ import annotations

import hashlib
import json
import sys
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Callable

import torch

from .decoding.cached_lm import CachedLM
from .environment import device_name
from .metrics import first_divergence
from .records import write_json

CALIBRATION_TEXTS = (
    "def fibonacci(n):\n    \"\"\"Return the n-th Fibonacci number.\"\"\"\n",
    "Natalia sold clips to 48 of her friends in April, and then she sold half as many clips in May. "
    "How many clips did Natalia sell altogether in April and May?",
)
IDENTICAL, NEAR_TIE, MISMATCH = "identical", "near-tie", "MISMATCH"
TOLERANCE_FACTOR = 4  # gap <= 4δ: see the module docstring


@dataclass
class NoiseProfile:
    """max |logit(one-token steps) - logit(k-token block)| over the calibration run."""

    max_abs_diff: float
    per_block: dict  # "causal-<k>" / "tree-<k>" -> max |Δ| for that path
    positions: int

    @property
    def tolerance(self) -> float:
        return TOLERANCE_FACTOR * self.max_abs_diff


def _rows_by_blocks(lm: CachedLM, prompt: list[int], tokens: list[int], k: int, tree: bool) -> torch.Tensor:
    lm.forward(prompt, keep_last=1)
    rows = []
    for i in range(0, len(tokens), k):
        block = tokens[i:i + k]
        parents = list(range(-1, len(block) - 1)) if tree else None  # a chain fed through the explicit-mask path
        rows.append(lm.forward(block, keep_last=len(block), parents=parents))
    return torch.cat(rows)


def lm_maker(model_or_pair) -> Callable[[], CachedLM]:
    """A new CachedLM per call: of a bare model (eager), or of a pair's target in the pair's execution mode (a
    static cache of its own, role ``check``), so the noise is that of the forwards the run measured."""
    if hasattr(model_or_pair, "lm"):
        return lambda: model_or_pair.lm("check")
    return lambda: CachedLM(model_or_pair)


def greedy_steps(model, prompt: list[int], n: int) -> tuple[list[int], torch.Tensor]:
    """Greedy's next ``n`` tokens after ``prompt``, fed one at a time, and the logits each one-token step
    returned ([n, vocab]: row i follows token i, as a block forward's row i does). ``model``: a model or a pair
    (lm_maker)."""
    lm = lm_maker(model)()
    logits = lm.forward(prompt, keep_last=1)[-1]
    tokens, rows = [], []
    for _ in range(n):
        tokens.append(int(logits.argmax()))
        logits = lm.forward([tokens[-1]])[-1]
        rows.append(logits)
    return tokens, torch.stack(rows)


def measure_noise(model, prompts: list[list[int]], positions: int = 32, blocks=(2, 4, 8, 16, 32)) -> NoiseProfile:
    """Feed each prompt's greedy continuation one token at a time and in blocks of k (causal and tree-masked);
    δ = the largest absolute logit difference between the paths, over all positions and vocabulary entries.
    ``model``: a model, or a pair (its target in the pair's execution mode: lm_maker)."""
    per_block: dict[str, float] = {}
    new_lm = lm_maker(model)
    for prompt in prompts:
        tokens, steps = greedy_steps(model, prompt, positions)
        for k in blocks:
            for tree in (False, True):
                rows = _rows_by_blocks(new_lm(), prompt, tokens, k, tree)
                key = f"{'tree' if tree else 'causal'}-{k}"
                per_block[key] = max(per_block.get(key, 0.0), float((rows - steps).abs().max()))
    return NoiseProfile(max_abs_diff=max(per_block.values()), per_block=per_block, positions=positions * len(prompts))


def fingerprint(model) -> str:
    """A cheap digest of the weights (names, shapes, a few values of each), so a changed model never reuses
    another's noise. A GGUF file (llama.cpp) is named by its sha256."""
    if not isinstance(model, torch.nn.Module):
        return model.describe()["sha256"][:16]
    digest = hashlib.sha1()
    for name, param in model.named_parameters():
        digest.update(f"{name}{tuple(param.shape)}".encode())
        digest.update(param.detach().flatten()[:16].float().cpu().numpy().tobytes())
    return digest.hexdigest()[:16]


def noise_cache_path(pair, threads: int) -> Path:
    from .models.files import cache_root

    # the profile is the target's alone: what the pair says of its draft (loaded or not) must not split the cache
    identity = {"pair": pair.name, "info": pair.target_info, "precision": pair.precision.as_record(),
                **({"execution": pair.execution.as_record()} if pair.execution.static else {}),
                "threads": threads, "torch": torch.__version__, "device": str(pair.device),
                "device_name": device_name(pair.device), "weights": fingerprint(pair.target)}
    digest = hashlib.sha1(json.dumps(identity, sort_keys=True, default=str).encode()).hexdigest()[:16]
    return cache_root() / "noise" / f"{pair.name}-{pair.dtype}-{digest}.json"


def noise_profile(pair, threads: int) -> NoiseProfile:
    """The pair's measured noise, from the cache or measured now (seconds on a CPU; outside any timed region)."""
    path = noise_cache_path(pair, threads)
    if path.exists():
        return NoiseProfile(**json.loads(path.read_text()))
    print(f"[specbench] measuring the target's logit noise between one-token and block forwards ({pair.dtype}); "
          "once per pair, dtype and machine", file=sys.stderr)
    prompts = [pair.encode(text, chat=False) for text in CALIBRATION_TEXTS]
    profile = measure_noise(pair, prompts)
    write_json(path, asdict(profile))
    return profile


def logits_at(model, prefix: list[int], block: int) -> tuple[torch.Tensor, torch.Tensor]:
    """The target's next-token logits after ``prefix``: (by a one-token step, by a ``block``-token forward).
    ``model``: a model or a pair (lm_maker)."""
    new_lm = lm_maker(model)
    step = new_lm()
    if len(prefix) > 1:
        step.forward(prefix[:-1], keep_last=1)
    by_step = step.forward(prefix[-1:])[-1]
    if len(prefix) < 3:  # no room for a block after a prefill: the two ways coincide
        return by_step, by_step
    k = min(block, len(prefix) - 1)
    blocked = new_lm()
    blocked.forward(prefix[:-k], keep_last=1)
    by_block = blocked.forward(prefix[-k:], keep_last=1)[-1]
    return by_step, by_block


def first_difference(greedy_ids: list[int], method_ids: list[int]) -> dict:
    """{"verdict": identical}, or a MISMATCH at the first differing index with both tokens, to be refined by the
    gap there; a MISMATCH with a ``reason`` when one output stops where the other goes on (no choice between two
    tokens to weigh)."""
    d = first_divergence(greedy_ids, method_ids)
    if d is None:
        return {"verdict": IDENTICAL}
    g = greedy_ids[d] if d < len(greedy_ids) else None
    m = method_ids[d] if d < len(method_ids) else None
    result = {"verdict": MISMATCH, "index": d, "greedy_token": g, "method_token": m}
    if g is None or m is None:
        result["reason"] = "lengths differ with a common prefix"
    return result


class LosslessCheck:
    """Classifies a method's output against greedy's on the same prompt: identical / near-tie / MISMATCH."""

    def __init__(self, pair, threads: int, block: int = 5):
        self.pair, self.threads, self.block = pair, threads, block
        self._profile: NoiseProfile | None = None

    @property
    def profile(self) -> NoiseProfile:
        if self._profile is None:
            self._profile = noise_profile(self.pair, self.threads)
        return self._profile

    @torch.inference_mode()
    def classify(self, prompt_ids: list[int], greedy_ids: list[int], method_ids: list[int]) -> dict:
        result = first_difference(greedy_ids, method_ids)
        if result["verdict"] == IDENTICAL or "reason" in result:
            return result
        d, g, m = result["index"], result["greedy_token"], result["method_token"]
        by_step, by_block = logits_at(self.pair, list(prompt_ids) + list(greedy_ids[:d]), self.block)
        here = float((by_step - by_block).abs().max())
        tolerance = TOLERANCE_FACTOR * max(self.profile.max_abs_diff, here)
        gap = float(by_step[g] - by_step[m])
        result.update(gap_step=gap, gap_block=float(by_block[g] - by_block[m]), noise_here=here,
                      noise_calibrated=self.profile.max_abs_diff, tolerance=tolerance,
                      verdict=NEAR_TIE if gap <= tolerance else MISMATCH)
        return result
