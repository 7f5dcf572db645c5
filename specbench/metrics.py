"""Every derived number, computed in one place from raw records: rates, τ, acceptance, speedup, losslessness.

Speedup is the ratio of throughputs Σtokens/Σtime of the method and of its greedy baseline over the
prompts both have (identical to baseline time / method time when outputs are identical, and not
biased by different output lengths when sampling).
"""
from __future__ import annotations

import math
import statistics
from collections import defaultdict

from .scoring import aggregate_scores


def _mean(values):
    values = [v for v in values if v is not None]
    return statistics.fmean(values) if values else None


def _std(values):
    values = [v for v in values if v is not None]
    return statistics.stdev(values) if len(values) > 1 else 0.0 if values else None


def rate(records) -> float | None:
    """Σ new tokens / Σ wall seconds."""
    time = sum(r["wall_s"] for r in records)
    return sum(r["new_tokens"] for r in records) / time if time > 0 else None


def tau(records) -> float | None:
    """τ: mean tokens emitted per target forward, the prompt-reading forward included (bonus/correction
    token counted). From per-step accept lengths when the method reports them, otherwise (hf_assisted)
    new tokens / target forwards, which is the same quantity.
    """
    steps = [n for r in records for n in (r.get("accept_lengths") or [])]
    if steps:
        return sum(steps) / len(steps)
    forwards = sum(r.get("target_forwards") or 0 for r in records)
    return sum(r["new_tokens"] for r in records) / forwards if forwards else None


def mean_sl(records) -> float | None:
    """Mean tokens drafted per step (the speculation length actually used), for methods that record it
    per step in ``extra.sl`` (the SL policies); None otherwise."""
    steps = [n for r in records for n in (r.get("extra") or {}).get("sl", [])]
    return statistics.fmean(steps) if steps else None


def acceptance_rate(records) -> float | None:
    drafted = sum(r.get("drafted") or 0 for r in records)
    return sum(r.get("accepted") or 0 for r in records) / drafted if drafted else None


def first_divergence(a: list[int], b: list[int]) -> int | None:
    """Index of the first differing token, None when the sequences are identical."""
    for i, (x, y) in enumerate(zip(a, b)):
        if x != y:
            return i
    return None if len(a) == len(b) else min(len(a), len(b))


def by_prompt(records) -> dict[str, list[dict]]:
    groups = defaultdict(list)
    for r in records:
        groups[r["prompt_id"]].append(r)
    return groups


def losslessness(records, baseline) -> dict:
    """Per-prompt exact match of output ids against the baseline (first repeat of each)."""
    ours, base = by_prompt(records), by_prompt(baseline)
    per_prompt = {}
    for pid in ours.keys() & base.keys():
        a = min(ours[pid], key=lambda r: r["repeat"])["output_ids"]
        b = min(base[pid], key=lambda r: r["repeat"])["output_ids"]
        per_prompt[pid] = first_divergence(a, b)
    identical = sum(1 for d in per_prompt.values() if d is None)
    return {"identical": identical, "compared": len(per_prompt), "first_divergence": per_prompt}


def summarize(records: list[dict], baseline: list[dict] | None = None, exact: bool = True,
              is_baseline: bool = False) -> dict:
    """The run summary row. ``baseline``: the greedy run's records on the same pair/data/settings.

    exact: compare output ids with the baseline's (temperature 0); sampled outputs are not compared.
    is_baseline: these records are the baseline itself (speedup 1 by definition, nothing to compare).
    """
    if not records:
        return {"prompts": 0}
    repeats = defaultdict(list)
    for r in records:
        repeats[r["repeat"]].append(r)
    per_repeat_rate = [rate(rs) for _, rs in sorted(repeats.items())]
    prefill = [r["prefill_s"] for r in records if r.get("prefill_s") is not None]
    new_tokens = sum(r["new_tokens"] for r in records)
    wall = sum(r["wall_s"] for r in records)
    summary = {
        "prompts": len(by_prompt(records)),
        "repeats": len(repeats),
        "new_tokens": new_tokens,
        "wall_s": wall,
        "tok_per_s": rate(records),
        "tok_per_s_std": _std(per_repeat_rate),
        "tok_per_s_prompt_mean": _mean(r["new_tokens"] / r["wall_s"] for r in records if r["wall_s"] > 0),
        "ms_per_token": 1000 * wall / new_tokens if new_tokens else None,
        "prefill_s_mean": _mean(prefill),
        "tau": tau(records),
        "acceptance_rate": acceptance_rate(records),
        "target_forwards": sum(r.get("target_forwards") or 0 for r in records),
        "draft_forwards": sum(r.get("draft_forwards") or 0 for r in records),
        "accuracy": aggregate_scores(records),
    }
    if is_baseline:
        summary.update(speedup=1.0, is_baseline=True)
    else:
        summary.update(compare(records, baseline, exact) if baseline else {"speedup": None})
    return summary


def compare(records, baseline, exact: bool = True) -> dict:
    """Speedup (mean ± std over repeats, and mean of per-prompt ratios) and losslessness vs the baseline."""
    ours, base = by_prompt(records), by_prompt(baseline)
    common = sorted(ours.keys() & base.keys())
    if not common:
        return {"speedup": None, "baseline_prompts": 0}
    base_rate = rate([r for pid in common for r in base[pid]])
    repeats = sorted({r["repeat"] for pid in common for r in ours[pid]})
    per_repeat = [rate([r for pid in common for r in ours[pid] if r["repeat"] == k]) for k in repeats]
    per_prompt = [rate(ours[pid]) / rate(base[pid]) for pid in common if rate(ours[pid]) and rate(base[pid])]
    lossless = losslessness(records, baseline) if exact else {"identical": None, "compared": 0, "first_divergence": {}}
    return {
        "speedup": rate([r for pid in common for r in ours[pid]]) / base_rate if base_rate else None,
        "speedup_std": _std([r / base_rate for r in per_repeat if r]) if base_rate else None,
        "speedup_prompt_mean": _mean(per_prompt),
        "baseline_tok_per_s": base_rate,
        "baseline_prompts": len(common),
        "identical": lossless["identical"],
        "compared": lossless["compared"],
        "first_divergence": lossless["first_divergence"],
    }


def fmt(value, spec: str = ".2f", missing: str = "-") -> str:
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return missing
    return format(value, spec)
