"""Every derived number, computed in one place from raw records: rates, τ, acceptance, speedup, losslessness.

Speedup (``compare``) is paired when the baseline was timed next to the method in the same rounds
(runner.py): the mean of per-prompt ratios of throughputs, with a bootstrap interval; otherwise the
ratio of throughputs Σtokens/Σtime over the prompts both have. Throughput ratios equal time ratios
when outputs are identical, and are not biased by different output lengths when sampling.
"""
from __future__ import annotations

import math
import random
import statistics
from collections import Counter, defaultdict

from .records import round_of
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


def paired_baseline(records, baseline) -> dict[str, dict] | None:
    """round id -> the baseline record timed in that round, when every record has its pair; else None."""
    rounds = {round_of(r): r for r in baseline if round_of(r) is not None}
    if records and all(round_of(r) in rounds for r in records):
        return rounds
    return None


def reference_of(record: dict, baseline_by_prompt: dict, paired: dict | None) -> dict | None:
    """The greedy record this record is compared with: its round's baseline, else the prompt's first repeat."""
    if paired is not None:
        return paired[round_of(record)]
    candidates = baseline_by_prompt.get(record["prompt_id"])
    return min(candidates, key=lambda r: r["repeat"]) if candidates else None


def losslessness(records, baseline, paired: dict | None = None) -> dict:
    """Per prompt (first repeat): identical to greedy, or diverged, and how the divergence was classified.

    The verdict (identical / near-tie / MISMATCH, lossless.py) is recorded by the runner, which has the
    model; a divergence without one (records from before it existed) counts as unclassified.
    """
    base = by_prompt(baseline)
    per_prompt, verdicts = {}, {}
    for pid, rs in by_prompt(records).items():
        ours = min(rs, key=lambda r: r["repeat"])
        ref = reference_of(ours, base, paired)
        if ref is None:
            continue
        per_prompt[pid] = first_divergence(ours["output_ids"], ref["output_ids"])
        if per_prompt[pid] is not None:
            verdicts[pid] = (ours.get("lossless") or {}).get("verdict", "unclassified")
    counts = Counter(verdicts.values())
    return {"identical": sum(1 for d in per_prompt.values() if d is None), "compared": len(per_prompt),
            "near_ties": counts.get("near-tie", 0), "mismatches": counts.get("MISMATCH", 0),
            "unclassified": counts.get("unclassified", 0), "first_divergence": per_prompt, "divergences": verdicts}


def bootstrap_mean_ci(values_by_unit: list[list[float]], level: float = 0.95, samples: int = 4000,
                      seed: int = 0) -> tuple[float, float] | None:
    """Percentile bootstrap interval of the mean over units (prompts), each unit the mean of its values
    (repeats). One unit with several values: resample its values instead. None with fewer than 2 values.
    Seeded, so the same records always give the same interval."""
    units = [statistics.fmean(v) for v in values_by_unit if v]
    if len(units) < 2:
        units = [x for v in values_by_unit for x in v]
        if len(units) < 2:
            return None
    rng = random.Random(seed)
    n = len(units)
    means = sorted(statistics.fmean(rng.choices(units, k=n)) for _ in range(samples))
    tail = (1 - level) / 2
    return means[int(tail * (samples - 1))], means[int(round((1 - tail) * (samples - 1)))]


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
    """Speed-up and losslessness against the baseline.

    Paired (every record has a baseline timed in its round, ``runner.pairing=interleaved``): speedup is the
    mean over prompts of the per-round ratio (method tok/s over its round's baseline tok/s; repeats of a
    prompt averaged first), with a 95% bootstrap interval over prompts; ``speedup_total`` is Σtokens/Σtime
    of the method over that of the same paired baseline records. Unpaired: speedup is Σtokens/Σtime over
    the prompts both have (baseline timed separately, so load drift between the two is in the number).
    """
    paired = paired_baseline(records, baseline)
    lossless = losslessness(records, baseline, paired) if exact else {
        "identical": None, "compared": 0, "first_divergence": {}}
    if paired is not None:
        partners = [paired[round_of(r)] for r in records]
        ratios = defaultdict(list)
        for r, b in zip(records, partners):
            if rate([r]) and rate([b]):
                ratios[r["prompt_id"]].append(rate([r]) / rate([b]))
        per_repeat = defaultdict(list)
        for r, b in zip(records, partners):
            per_repeat[r["repeat"]].append((r, b))
        repeat_speedups = [rate([r for r, _ in pairs]) / rate([b for _, b in pairs]) for pairs in per_repeat.values()]
        speedup = statistics.fmean(statistics.fmean(v) for v in ratios.values()) if ratios else None
        return {
            "speedup": speedup,
            "speedup_ci95": bootstrap_mean_ci(list(ratios.values())),
            "speedup_total": rate(records) / rate(partners) if rate(partners) else None,
            "speedup_std": _std(repeat_speedups),
            "speedup_prompt_mean": speedup,
            "paired": True,
            "pairs": len(partners),
            "baseline_tok_per_s": rate(partners),
            "baseline_prompts": len(ratios),
            **lossless,
        }
    ours, base = by_prompt(records), by_prompt(baseline)
    common = sorted(ours.keys() & base.keys())
    if not common:
        return {"speedup": None, "baseline_prompts": 0, "paired": False}
    base_rate = rate([r for pid in common for r in base[pid]])
    repeats = sorted({r["repeat"] for pid in common for r in ours[pid]})
    per_repeat = [rate([r for pid in common for r in ours[pid] if r["repeat"] == k]) for k in repeats]
    per_prompt = [rate(ours[pid]) / rate(base[pid]) for pid in common if rate(ours[pid]) and rate(base[pid])]
    speedup = rate([r for pid in common for r in ours[pid]]) / base_rate if base_rate else None
    return {
        "speedup": speedup,
        "speedup_ci95": None,
        "speedup_total": speedup,
        "speedup_std": _std([r / base_rate for r in per_repeat if r]) if base_rate else None,
        "speedup_prompt_mean": _mean(per_prompt),
        "paired": False,
        "baseline_tok_per_s": base_rate,
        "baseline_prompts": len(common),
        **lossless,
    }


def fmt(value, spec: str = ".2f", missing: str = "-") -> str:
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return missing
    return format(value, spec)
