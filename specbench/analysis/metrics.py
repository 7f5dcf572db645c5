"""Every derived number, computed in one place from raw records: rates, τ, acceptance (overall and per
position, α_k), speedup, losslessness. At T = 0 the speed-up and τ a summary names plainly are over identical
work (analysis/identical_work.py), the whole-output ones beside them (``speedup_whole``, ``tau_whole``).

Speedup (``compare``) is paired when the baseline was timed next to the method in the same rounds
(run/runner.py): the mean of per-prompt ratios of throughputs, with a bootstrap interval; otherwise the
ratio of throughputs Σtokens/Σtime over the prompts both have. Throughput ratios equal time ratios
when outputs are identical, and are not biased by different output lengths when sampling.
"""
from __future__ import annotations

import math
import random
import statistics
from collections import Counter, defaultdict

from .summary import Summary
from .identical_work import cell_flags, first_divergence, shared_work
from ..records.schema import RunRecord
from ..scoring import aggregate_scores


def _mean(values):
    values = [v for v in values if v is not None]
    return statistics.fmean(values) if values else None


def _std(values):
    values = [v for v in values if v is not None]
    return statistics.stdev(values) if len(values) > 1 else 0.0 if values else None


def rate(records) -> float | None:
    """Σ new tokens / Σ wall seconds."""
    time = sum(r.wall_s for r in records)
    return sum(r.new_tokens for r in records) / time if time > 0 else None


def tau(records) -> float | None:
    """τ: mean tokens emitted per target forward, the prompt-reading forward included (bonus/correction
    token counted). From per-step accept lengths when the method reports them, otherwise (hf_assisted)
    new tokens / target forwards, which is the same quantity.
    """
    steps = [n for r in records for n in (r.accept_lengths or [])]
    if steps:
        return sum(steps) / len(steps)
    forwards = sum(r.target_forwards or 0 for r in records)
    return sum(r.new_tokens for r in records) / forwards if forwards else None


def tau_decoding(records) -> float | None:
    """τ over the decoding steps only: each turn's first step (the forward that reads its prompt) left out, its tokens
    with it. Spec-Bench's #Mean Accepted Tokens counts this way for its tree methods (EAGLE's and Medusa's loops emit
    the prefill's token before they count steps); ``tau`` (design rule 5) counts every target forward. They differ
    where answers are short: a 17-token answer in 7 steps is 2.43 by ``tau``, 16 / 6 = 2.67 here. None without
    per-step accept lengths (hf_assisted, vLLM) or with no step after the first."""
    steps = [n for r in records for turn in r.turn_list for n in (turn.accept_lengths or [])[1:]]
    return sum(steps) / len(steps) if steps else None


def mean_sl(records) -> float | None:
    """Mean tokens drafted per step (the speculation length actually used), for methods that record it
    per step in ``extra.sl`` (the SL policies); None otherwise."""
    steps = [n for r in records for n in r.extra.get("sl", [])]
    return statistics.fmean(steps) if steps else None


def acceptance_rate(records) -> float | None:
    drafted = sum(r.drafted or 0 for r in records)
    return sum(r.accepted or 0 for r in records) / drafted if drafted else None


def accepted_per_step(record: RunRecord) -> list[tuple[int, int]]:
    """(accepted draft tokens, proposed depth) per verification step of a record, both raw counters of
    Generation.add_step (``accepted_steps``, ``proposed``: trimmed to the tokens the output keeps, so a step cut
    at an EOS among its drafts counts the drafts up to it, and its depth is trimmed to them). [] when the record
    has no ``proposed`` (records written before it existed, hf_assisted when its call pattern did not fit) or
    the lists disagree in length."""
    accepted, proposed = record.accepted_steps or [], record.proposed or []
    if not proposed or len(proposed) != len(accepted):
        return []
    return list(zip(accepted, proposed))


def acceptance_by_position(records, max_k: int | None = None) -> list[float | None]:
    """Per-position acceptance [α_1, ..., α_K] over every verification step of ``records``.

    α_k = among steps whose proposal reached depth k and whose first k-1 draft tokens were all accepted, the
    fraction that accepted the k-th too. K is the deepest proposal, or ``max_k``; a position no step reached is
    None. [] when no step proposed anything (greedy's zeros, records without ``proposed``).
    """
    steps = [s for r in records for s in accepted_per_step(r)]
    depth = max((p for _, p in steps), default=0) if max_k is None else max_k
    alpha: list[float | None] = []
    for k in range(1, depth + 1):
        reached = [a for a, p in steps if p >= k and a >= k - 1]
        alpha.append(sum(a >= k for a in reached) / len(reached) if reached else None)
    return alpha


def by_prompt(records) -> dict[str, list[RunRecord]]:
    groups = defaultdict(list)
    for r in records:
        groups[r.prompt_id].append(r)
    return groups


def partners_of(records, baseline) -> dict[str, RunRecord]:
    """round id -> the baseline record timed in that round, for the rounds of ``records`` that have one."""
    wanted = {r.round for r in records} - {None}
    return {b.round: b for b in baseline if b.round in wanted}


def matched_baseline(records, baseline) -> list[RunRecord]:
    """The baseline records these records are measured against: their rounds' partners when they were paired,
    else the baseline as the run measured against it, one record per (prompt, repeat) (``one_per_prompt``: not
    the lines other methods' rounds added to its file)."""
    partners = partners_of(records, baseline)
    return [partners[r.round] for r in records if r.round in partners] if partners else one_per_prompt(baseline)


def first_repeat(records, prompt_id: str) -> RunRecord | None:
    """The lowest-repeat record of ``prompt_id`` that ``one_per_prompt`` keeps (a stored baseline's reference for
    that prompt), if any."""
    mine = one_per_prompt(r for r in records if r.prompt_id == prompt_id)
    return min(mine, key=lambda r: r.repeat) if mine else None


def one_per_prompt(records) -> list[RunRecord]:
    """One record per (prompt, repeat), in stored order: the first timed alone (``round`` None: a baseline run on
    its own, ``runner.pairing=separate``) where there is one, else the first stored. A baseline file also holds one
    line per round it was paired in with some method; a baseline summarised or compared on its own counts each
    (prompt, repeat) once, timed as a run on its own is (run/runner.py times those alone)."""
    records = list(records)
    alone = {(r.prompt_id, r.repeat) for r in records if r.round is None}
    seen, out = set(), []
    for r in records:
        key = (r.prompt_id, r.repeat)
        if key not in seen and (r.round is None or key not in alone):
            seen.add(key)
            out.append(r)
    return out


def same_repeat(candidates: list[RunRecord], record: RunRecord) -> RunRecord:
    """Of a prompt's baseline records (one per repeat: ``one_per_prompt``), the one of ``record``'s repeat, else the
    first repeat: what an unpaired record's identical work is compared with."""
    return next((b for b in candidates if b.repeat == record.repeat), None) or min(candidates, key=lambda b: b.repeat)


def reference_of(record: RunRecord, baseline: list[RunRecord], paired: dict | None) -> RunRecord | None:
    """The greedy record this record is compared with: its round's baseline, else the prompt's first repeat."""
    if paired is not None and record.round in paired:
        return paired[record.round]
    return first_repeat(baseline, record.prompt_id)


# the checks whose MISMATCH stands whatever the ids show: not at the first divergence's index (analysis/lossless.py)
STANDING_CHECKS = ("own_forward", "agreement", "continuation")


def verdict_of(record: RunRecord, reference: RunRecord, divergence: int | None) -> str | None:
    """The runner's recorded verdict, when it was made against this reference and agrees with what the ids show:
    identical (None), near-tie or MISMATCH. A MISMATCH found by a check other than the divergence's gap (a token its
    own forward did not rank first; rows beyond the noise of greedy's where both chose alike; past a near-tie, rows
    beyond the noise of one-token rows along its own output: analysis/lossless.py) stands whatever the ids show
    and whichever greedy record is the reference now.
    Otherwise ``unclassified`` (e.g. records compared with another baseline than the one they were checked against), so
    identical + near-ties + mismatches + unclassified add up to the prompts compared."""
    stored = record.lossless or {}
    same_reference = stored.get("against", reference.round) == reference.round
    if stored.get("verdict") == "MISMATCH" and stored.get("check") in STANDING_CHECKS:  # whichever greedy line
        return "MISMATCH"  # the summary compares with: the method's own rows broke, not its ids
    if divergence is None:
        return None
    if not same_reference or stored.get("index") != divergence:
        return "unclassified"
    return stored.get("verdict") if stored.get("verdict") in ("near-tie", "MISMATCH") else "unclassified"


def losslessness(records, baseline, paired: dict | None = None) -> dict:
    """Per prompt (first repeat): identical to greedy, or diverged, and how the divergence was classified.

    The verdict (identical / near-tie / MISMATCH, analysis/lossless.py) is recorded by the runner, which has the
    model; a divergence it could not classify counts as unclassified. ``largest_gap``: the near-tie whose gap came
    closest to its tolerance (what a reader weighs "differs only by rounding" by).
    """
    per_prompt, verdicts, gaps = {}, {}, []
    for pid, rs in by_prompt(records).items():
        ours = min(rs, key=lambda r: r.repeat)
        ref = reference_of(ours, baseline, paired)
        if ref is None:
            continue
        per_prompt[pid] = first_divergence(ours.output_ids, ref.output_ids)
        verdict = verdict_of(ours, ref, per_prompt[pid])
        if verdict is not None:
            verdicts[pid] = verdict
        stored = ours.lossless or {}
        if verdict == "near-tie" and stored.get("gap") is not None and stored.get("tolerance"):
            gaps.append({"prompt": pid, "gap": stored["gap"], "tolerance": stored["tolerance"]})
    counts = Counter(verdicts.values())
    out = {"identical": sum(1 for pid, d in per_prompt.items() if d is None and pid not in verdicts),
           "compared": len(per_prompt), "near_ties": counts.get("near-tie", 0), "mismatches": counts.get("MISMATCH", 0),
           "unclassified": counts.get("unclassified", 0), "first_divergence": per_prompt, "divergences": verdicts}
    if gaps:
        out["largest_gap"] = max(gaps, key=lambda g: g["gap"] / g["tolerance"])
    return out


T_975 = (12.706, 4.303, 3.182, 2.776, 2.571, 2.447, 2.365, 2.306, 2.262, 2.228, 2.201, 2.179, 2.160, 2.145, 2.131,
         2.120, 2.110, 2.101, 2.093, 2.086, 2.080, 2.074, 2.069, 2.064, 2.060, 2.056, 2.052, 2.048, 2.045, 2.042)


def t_975(df: int) -> float:
    """Student's t 97.5% quantile: a table to 30 degrees of freedom, the Cornish-Fisher expansion above."""
    if df <= len(T_975):
        return T_975[df - 1]
    z = 1.959964
    return z + (z ** 3 + z) / (4 * df) + (5 * z ** 5 + 16 * z ** 3 + 3 * z) / (96 * df ** 2)


def bootstrap_mean_ci(values_by_unit: list[list[float]], samples: int = 8000,
                      seed: int = 0) -> tuple[float, float] | None:
    """95% interval of the mean over units (prompts; each unit the mean of its repeats): the *expanded* percentile
    bootstrap (Hesterberg 2015). The plain percentile interval is too narrow for the handful of prompts a CPU
    benchmark has (at n = 4 about half as wide as it should be); expanded, its tails are read at
    Φ(-sqrt(n/(n-1)) · t_{0.975, n-1}) instead of 2.5%, which restores close to 95% coverage for small n and
    tends to the plain one for large n. One unit with several values: resample its values (an interval over
    repeats: timing noise only). None with fewer than 2 values. Seeded: the same records give the same interval.
    """
    units = [statistics.fmean(v) for v in values_by_unit if v]
    if len(units) < 2:
        units = [x for v in values_by_unit for x in v]
        if len(units) < 2:
            return None
    n = len(units)
    tail = statistics.NormalDist().cdf(-math.sqrt(n / (n - 1)) * t_975(n - 1))
    rng = random.Random(seed)
    means = sorted(statistics.fmean(rng.choices(units, k=n)) for _ in range(samples))
    low = min(int(tail * samples), samples - 1)
    return means[low], means[samples - 1 - low]


def bootstrap_ratio_ci(units: list[tuple[float, float]], samples: int = 8000,
                       seed: int = 0) -> tuple[float, float] | None:
    """95% interval of a pooled ratio Σ numerators / Σ denominators (τ: tokens over steps) over units (prompts),
    by the same expanded percentile bootstrap as ``bootstrap_mean_ci``, resampling whole units. None with fewer
    than 2 units."""
    units = [(a, b) for a, b in units if b > 0]
    n = len(units)
    if n < 2:
        return None
    tail = statistics.NormalDist().cdf(-math.sqrt(n / (n - 1)) * t_975(n - 1))
    rng = random.Random(seed)
    ratios = []
    for _ in range(samples):
        drawn = rng.choices(units, k=n)
        ratios.append(sum(a for a, _ in drawn) / sum(b for _, b in drawn))
    ratios.sort()
    low = min(int(tail * samples), samples - 1)
    return ratios[low], ratios[samples - 1 - low]


def batches_of(records) -> dict[str, dict]:
    """batch id -> that batch's ``batch`` fields (size, wall_s, new_tokens), for records measured in batches
    (engine=vllm); only batches whose every request is among ``records`` (a crash may have cut one short)."""
    seen: dict[str, dict] = {}
    counts: Counter = Counter()
    for r in records:
        batch = r.batch
        if batch:
            seen[batch["id"]] = batch
            counts[batch["id"]] += 1
    return {b: info for b, info in seen.items() if counts[b] == info["size"]}


def batch_rate(records) -> float | None:
    """Throughput: Σ tokens of whole batches / Σ their wall times (None: no batched records)."""
    batches = batches_of(records).values()
    wall = sum(b["wall_s"] for b in batches)
    return sum(b["new_tokens"] for b in batches) / wall if wall > 0 else None


def throughput_compare(records, baseline) -> dict:
    """Paired throughput speed-up of batched records: each whole batch against the baseline batch timed in its
    round (found through its requests' round partners); the mean of per-batch throughput ratios with a 95%
    bootstrap interval over batches, and the ratio of total throughputs."""
    partners = partners_of(records, baseline)
    mine = batches_of(records)
    theirs = batches_of(baseline)
    pairs = {}
    for r in records:
        b = (r.batch or {}).get("id")
        partner = partners.get(r.round)
        other = ((partner.batch if partner else None) or {}).get("id")
        if b in mine and other in theirs:
            pairs[b] = other
    if not pairs:
        return {}
    partner_batches = set(pairs.values())
    ratios = [(mine[b]["new_tokens"] / mine[b]["wall_s"]) / (theirs[o]["new_tokens"] / theirs[o]["wall_s"])
              for b, o in pairs.items()]
    total = (sum(mine[b]["new_tokens"] for b in pairs) / sum(mine[b]["wall_s"] for b in pairs)) / (
        sum(theirs[o]["new_tokens"] for o in pairs.values()) / sum(theirs[o]["wall_s"] for o in pairs.values()))
    return {"throughput_speedup": statistics.fmean(ratios), "throughput_speedup_ci95": bootstrap_mean_ci(
        [[x] for x in ratios]), "throughput_speedup_total": total, "batches": len(pairs),
        "baseline_batch_tok_per_s": batch_rate([b for b in baseline if (b.batch or {}).get("id")
                                                in partner_batches])}


def summarize(records: list[RunRecord], baseline: list[RunRecord] | None = None, exact: bool = True,
              is_baseline: bool = False) -> Summary:
    """The run summary row (its keys: analysis/summary.Summary). ``baseline``: the greedy run's records on the same
    pair/data/settings.

    exact: compare output ids with the baseline's (temperature 0); sampled outputs are not compared.
    is_baseline: these records are the baseline itself (speedup 1 by definition, nothing to compare).
    """
    if not records:
        return {"prompts": 0}
    repeats = defaultdict(list)
    for r in records:
        repeats[r.repeat].append(r)
    per_repeat_rate = [rate(rs) for _, rs in sorted(repeats.items())]
    prefill = [r.prefill_s for r in records if r.prefill_s is not None]
    new_tokens = sum(r.new_tokens for r in records)
    wall = sum(r.wall_s for r in records)
    summary = {
        "prompts": len(by_prompt(records)),
        "repeats": len(repeats),
        "new_tokens": new_tokens,
        "wall_s": wall,
        "tok_per_s": rate(records),
        "tok_per_s_std": _std(per_repeat_rate),
        "tok_per_s_prompt_mean": _mean(r.new_tokens / r.wall_s for r in records if r.wall_s > 0),
        "ms_per_token": 1000 * wall / new_tokens if new_tokens else None,
        "prefill_s_mean": _mean(prefill),
        "tau": tau(records),
        "tau_decoding": tau_decoding(records),
        "acceptance_rate": acceptance_rate(records),
        "alpha": acceptance_by_position(records) or None,
        "target_forwards": sum(r.target_forwards or 0 for r in records),
        "draft_forwards": sum(r.draft_forwards or 0 for r in records),
        "accuracy": aggregate_scores(records),
    }
    if is_baseline:
        summary.update(speedup=1.0, speedup_whole=1.0, is_baseline=True)
    else:
        summary.update(compare(records, baseline, exact) if baseline else {"speedup": None})
    if batches_of(records):  # engine=vllm: per-request numbers above are latencies; throughput per batch here
        summary.update(batch_size=max(b["size"] for b in batches_of(records).values()),
                       batch_tok_per_s=batch_rate(records))
        if is_baseline:
            summary["throughput_speedup"] = 1.0
        elif baseline:
            summary.update(throughput_compare(records, baseline))
    return summary


def compare(records, baseline, exact: bool = True) -> dict:
    """Speed-up, τ and losslessness against the baseline.

    At T = 0 (``exact``) the speed-up and τ are over **identical work** (analysis/identical_work.py): each prompt
    compared over the tokens both outputs share, both clocks read at that token; the whole-output figures stay beside
    them (``speedup_whole``, ``tau_whole``). Sampled outputs are not compared: their speed-up is the whole-output one.

    Paired (records whose baseline was timed in their round, ``runner.pairing=interleaved``): speedup is the
    mean over prompts of the per-round ratio (repeats of a prompt averaged first), with a 95% bootstrap interval
    over prompts; ``speedup_total`` is Σtokens/Σtime of the method's whole outputs over that of the same paired
    baseline records (what the bound's efficiency divides); ``speedup_std`` the std over repeats of the per-repeat
    mean ratio. Records without a partner (a baseline line lost) are left out and counted (``unpaired_records``).
    Unpaired: speedup is a ratio of sums over the prompts both have (baseline timed separately, so load drift
    between the two is in the number), against the baseline's records one per (prompt, repeat) as the run compared
    them (``one_per_prompt``: timed alone where they were); identical work pairs each repeat with the baseline's
    same repeat (else its first), so where nothing diverged it equals the whole-output ratio.
    """
    partners = partners_of(records, baseline)
    lossless = losslessness(records, baseline, partners) if exact else {
        "identical": None, "compared": 0, "first_divergence": {}}
    paired = [(r, partners[r.round]) for r in records if r.round in partners]
    paired = [(r, b) for r, b in paired if rate([r]) and rate([b])]
    if paired:
        whole, by_repeat_ratio = defaultdict(list), defaultdict(list)
        for r, b in paired:
            ratio = rate([r]) / rate([b])
            whole[r.prompt_id].append(ratio)
            by_repeat_ratio[r.repeat].append(ratio)
        ours, theirs = [r for r, _ in paired], [b for _, b in paired]
        speedup_whole = statistics.fmean(statistics.fmean(v) for v in whole.values())
        whole_ci95 = bootstrap_mean_ci(list(whole.values()))
        out = {
            "speedup": speedup_whole,
            "speedup_ci95": whole_ci95,
            "speedup_whole": speedup_whole,
            "speedup_whole_ci95": whole_ci95,
            "speedup_total": rate(ours) / rate(theirs),
            "speedup_std": _std([statistics.fmean(v) for v in by_repeat_ratio.values()]),
            "speedup_prompt_mean": speedup_whole,
            "paired": True,
            "pairs": len(paired),
            "unpaired_records": len(records) - len(paired),
            "baseline_tok_per_s": rate(theirs),
            "baseline_prompts": len(whole),
            **lossless,
        }
        if exact:
            out.update(over_identical_work(paired, paired=True))
        return out
    baseline = one_per_prompt(baseline)  # as the run compared: not other methods' rounds' lines
    ours, base = by_prompt(records), by_prompt(baseline)
    common = sorted(ours.keys() & base.keys())
    if not common:
        return {"speedup": None, "baseline_prompts": 0, "paired": False}
    base_rate = rate([r for pid in common for r in base[pid]])
    repeats = sorted({r.repeat for pid in common for r in ours[pid]})
    per_repeat = [rate([r for pid in common for r in ours[pid] if r.repeat == k]) for k in repeats]
    per_prompt = [rate(ours[pid]) / rate(base[pid]) for pid in common if rate(ours[pid]) and rate(base[pid])]
    speedup = rate([r for pid in common for r in ours[pid]]) / base_rate if base_rate else None
    out = {
        "speedup": speedup,
        "speedup_ci95": None,
        "speedup_whole": speedup,
        "speedup_total": speedup,
        "speedup_std": _std([r / base_rate for r in per_repeat if r]) if base_rate else None,
        "speedup_prompt_mean": _mean(per_prompt),
        "paired": False,
        "baseline_tok_per_s": base_rate,
        "baseline_prompts": len(common),
        **lossless,
    }
    if exact:
        out.update(over_identical_work([(r, same_repeat(base[pid], r)) for pid in common for r in ours[pid]],
                                       paired=False))
    return out


def by_prompt_works(works) -> dict:
    """prompt id -> its comparisons (one per repeat) with any shared work."""
    out = defaultdict(list)
    for r, w in works:
        if w.speedup is not None:
            out[r.prompt_id].append(w)
    return out


def over_identical_work(pairs, paired: bool) -> dict:
    """Speed-up and τ over the tokens each (record, baseline record) pair emitted alike (analysis/identical_work.py),
    the whole-output figures kept under ``speedup_whole`` / ``tau_whole``. Paired: the mean over prompts of per-prompt
    ratios with a bootstrap interval; unpaired: Σ greedy time / Σ method time. τ pooled (Σ tokens / Σ steps, the
    table's) and ``tau_prompt_mean`` (each prompt's τ, averaged)."""
    works = [(r, shared_work(r, b)) for r, b in pairs]
    by_prompt = by_prompt_works(works)
    compared = [w for ws in by_prompt.values() for w in ws]
    if paired:
        ratios = [[w.speedup for w in ws] for ws in by_prompt.values()]
        speedup = statistics.fmean(statistics.fmean(v) for v in ratios) if ratios else None
        prompt_mean, interval = speedup, bootstrap_mean_ci(ratios)
    else:  # ratios of sums: overall, and per prompt (each repeat against greedy's same one, else its first)
        method_s = sum(w.method_s for w in compared)
        speedup = sum(w.greedy_s for w in compared) / method_s if method_s else None
        per_prompt = [sum(w.greedy_s for w in ws) / sum(w.method_s for w in ws) for ws in by_prompt.values()]
        prompt_mean, interval = _mean(per_prompt), None
    per_prompt_tau = defaultdict(list)
    for r, w in works:
        if w.steps:
            per_prompt_tau[r.prompt_id].append(w.step_tokens / w.steps)
    steps, decoding = sum(w.steps for w in compared), sum(w.decoding_steps for w in compared)
    first = {}
    for r, w in sorted(works, key=lambda rw: rw[0].repeat):  # one comparison per prompt (its first repeat): flags
        first.setdefault(r.prompt_id, (r.repeat, w))
    return {
        "speedup": speedup, "speedup_ci95": interval, "speedup_prompt_mean": prompt_mean,
        "tau_whole": tau([r for r, _ in works]), "tau_decoding_whole": tau_decoding([r for r, _ in works]),
        # without per-step counts (hf_assisted, vLLM) τ stays the whole outputs' (tokens per target forward)
        "tau": sum(w.step_tokens for w in compared) / steps if steps else tau([r for r, _ in works]),
        "tau_ci95": bootstrap_ratio_ci([(sum(w.step_tokens for w in ws), sum(w.steps for w in ws))
                                        for ws in by_prompt.values()]),
        "tau_prompt_mean": statistics.fmean(statistics.fmean(v) for v in per_prompt_tau.values())
        if per_prompt_tau else None,
        "tau_decoding": sum(w.decoding_tokens for w in compared) / decoding if decoding else None,
        "identical_work": cell_flags([w for _, w in first.values()]),
        "identical_work_prompts": {pid: {"tokens": w.tokens, "shared_prefix": w.shared_prefix,
                                         "method_tokens": w.method_tokens, "greedy_tokens": w.greedy_tokens,
                                         "speedup": w.speedup, "unlike": w.unlike, "clock": w.clock}
                                   for pid, (_, w) in first.items()},
    }


def fmt(value, spec: str = ".2f", missing: str = "-") -> str:
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return missing
    return format(value, spec)
