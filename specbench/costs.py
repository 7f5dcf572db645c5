"""Forward costs T(k) of the target and the draft, and the speed-up they allow each method (``make bench``).

T(k): milliseconds for one forward of k new tokens after a real prompt (median of repeats), measured in
the same process as the methods. The papers' premise is T(γ+1) ≈ T(1) (verification is nearly free);
``T(k)/T(1)`` says how true that is on this machine.

The bound: a method's records say how many tokens each of its forwards fed (``forward_sizes``), so its
generation time predicted from the cost table is Σ T_model(k) over its forwards, and greedy's is
Σ T_target(1) (+ its prefill). bound = predicted greedy time / predicted method time: the speed-up the
method would have if nothing but forwards cost time. For speculative decoding with γ draft tokens this
is τ·T(1) / (T(γ+1) + γ·T_draft(1)) per step, the usual formula. efficiency = measured speed-up / bound, both
as Σ over Σ on the same paired prompts: what the method's own loop (sampling, cache bookkeeping, Python) leaves
of the bound. Prefill-sized blocks (> 32 tokens) are timed keeping one row of logits, as prefills do.
"""
from __future__ import annotations

import statistics
from bisect import bisect_left

from .decoding.cached_lm import CachedLM
from .timing import Stopwatch

TABLE_SIZES = (1, 2, 3, 4, 5, 6, 7, 8, 12, 16, 24, 32)
EXTRA_SIZES = (48, 64, 128, 256, 512)  # prefill-sized blocks, only to predict prefills
MEASURED_UP_TO = 64  # run_bound measures every block size a run fed up to this (Ouroboros' draft feeds 25-50)
ANCHORS = {1, 32, MEASURED_UP_TO}  # and these, to extrapolate prefills


def measure_costs(model, prompt: list[int], sizes=TABLE_SIZES + EXTRA_SIZES, repeats: int = 3) -> dict[int, float]:
    """ms per forward of k tokens after ``prompt``, the cache cropped back to the prompt after each: the median
    of ``repeats`` passes over all sizes (after one warm pass), sizes interleaved within a pass so that a load
    change on the machine hits every size alike instead of skewing the ratio T(k)/T(1).

    model: a transformers model (eager forwards), or a CachedLM of the execution mode to measure (``pair.lm``:
    static-cache forwards padded to buckets, CUDA graphs)."""
    lm = model if hasattr(model, "crop") else CachedLM(model)
    watch = Stopwatch(lm.device)
    lm.forward(prompt, keep_last=1)
    times: dict[int, list[float]] = {k: [] for k in sizes}
    for _ in range(repeats + 1):
        for k in sizes:
            watch.start()
            lm.forward((prompt * (k // len(prompt) + 1))[-k:], keep_last=k if k <= max(TABLE_SIZES) else 1)
            times[k].append(watch.stop())
            lm.crop(len(prompt))
    return {k: 1000 * statistics.median(t[1:]) for k, t in times.items()}


def interpolate(costs: dict[int, float], k: int) -> float:
    """T(k) from the table: exact where measured, linear between measured sizes; past the largest size M, linear with
    the slope between M and the measured size nearest M/2 (two neighbouring sizes, e.g. 31 and 32, are too close: the
    noise of a shared machine gives their difference either sign), never below T(M)."""
    sizes = sorted(costs)
    if k in costs:
        return costs[k]
    i = bisect_left(sizes, k)
    if i == 0:
        return costs[sizes[0]]
    if i == len(sizes):
        if len(sizes) == 1:
            return costs[sizes[0]]
        largest = sizes[-1]
        half = min(sizes[:-1], key=lambda s: abs(s - largest / 2))
        slope = max(0.0, (costs[largest] - costs[half]) / (largest - half))
        return costs[largest] + slope * (k - largest)
    lo, hi = sizes[i - 1], sizes[i]
    return costs[lo] + (costs[hi] - costs[lo]) * (k - lo) / (hi - lo)


def predicted_ms(records: list[dict], target_costs: dict[int, float], draft_costs: dict[int, float] | None) -> float:
    """Σ over the records' forwards of T(tokens fed) for the model that ran them."""
    total = 0.0
    for r in records:
        sizes = r.get("forward_sizes") or {}
        total += sum(interpolate(target_costs, k) for k in sizes.get("target", []))
        if draft_costs:
            total += sum(interpolate(draft_costs, k) for k in sizes.get("draft", []))
    return total


def bound(records: list[dict], baseline: list[dict], target_costs, draft_costs) -> float | None:
    """Speed-up allowed by the forward costs alone: predicted baseline time / predicted method time (same prompts)."""
    method_ms = predicted_ms(records, target_costs, draft_costs)
    base_ms = predicted_ms(baseline, target_costs, draft_costs)
    return base_ms / method_ms if method_ms > 0 and base_ms > 0 else None


def ratio_table(costs: dict[int, float]) -> dict[int, float]:
    """T(k)/T(1) over the table sizes."""
    return {k: costs[k] / costs[1] for k in TABLE_SIZES if k in costs}


def run_bound(pair, records: list[dict], baseline: list[dict], prompt: list[int], repeats: int = 3) -> dict | None:
    """The bound of one run (what ``python -m specbench`` prints beside the speed-up): T(k) measured now, after the
    timed generations, on this pair and machine, for every block size up to 64 the records fed (and 1, 32, 64 of
    each model: larger blocks, i.e. prefills, are extrapolated linearly from T(32)..T(64), as llama.cpp's and
    torch's compute-bound prefills scale, which underestimates long prefills by ~10-15%: both sides of the ratio
    have them); then ``bound`` over the method's records and their paired baseline records.
    None without a baseline or forward sizes (engine=vllm)."""
    from .metrics import matched_baseline

    base = matched_baseline(records, baseline) if baseline else []
    fed = {role: {k for r in records + base for k in (r.get("forward_sizes") or {}).get(role, [])
                  if k <= MEASURED_UP_TO} for role in ("target", "draft")}
    if not base or not fed["target"]:
        return None
    target = measure_costs(pair.lm("target"), prompt, sizes=sorted(fed["target"] | ANCHORS), repeats=repeats)
    draft = (measure_costs(pair.lm("draft"), prompt, sizes=sorted(fed["draft"] | ANCHORS), repeats=repeats)
             if fed["draft"] and pair.draft is not None else None)
    limit = bound(records, base, target, draft)
    if limit is None:
        return None
    verify = max((k for k in fed["target"] if k > 1), default=None)  # the largest verify block, for T(k)/T(1)
    return {"bound": limit, "target_ms": target, "draft_ms": draft, "prompt_tokens": len(prompt),
            "verify_ratio": {"k": verify, "ratio": target[verify] / target[1]} if verify else None}
