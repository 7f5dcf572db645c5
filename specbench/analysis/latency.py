"""Serving metrics from per-request token timelines: TTFT, TPOT, ITL, end-to-end latency and their percentiles,
throughput and goodput per load level, paired speed-ups of a speculative server over its baseline, and the load at
which speculation stops paying (the crossover), each with an interval.

A request's timeline (records/requests.Timeline, a served record's ``serving``) holds, relative to the level's start,
when it was due (``arrival_s``), sent (``sent_s``) and finished (``done_s``), and each streamed chunk as ``[seconds
after sending, tokens in the chunk]``: a speculative server streams the tokens one step accepted as one chunk.
Definitions, as production benchmark clients use them (vLLM's ``bench serve``, GuideLLM):

- TTFT: sending to the first chunk; E2E: sending to the last byte; ITL: the gap between consecutive chunks (one
  value per gap, so a chunk of several tokens is one gap, as a user sees it);
- TPOT: (E2E − TTFT) / (tokens − 1), the mean time per output token after the first (requests of one token have
  none);
- per-user tokens/s: tokens / E2E of each request (interactivity); throughput: all output tokens over the level's
  span (first send to last finish); goodput: requests per second that met the SLO (TTFT and TPOT limits, each
  optional).

Percentiles interpolate linearly between order statistics (numpy's default, as those clients report them).
"""
from __future__ import annotations

import math
import random
import statistics
from dataclasses import dataclass

from ..records.requests import Timeline
from .metrics import bootstrap_mean_ci

PERCENTILES = (50, 95, 99)


def percentile(values: list[float], q: float) -> float | None:
    """The q-th percentile (0..100), linear between order statistics; None for no values."""
    if not values:
        return None
    ordered = sorted(values)
    rank = (len(ordered) - 1) * q / 100
    low = math.floor(rank)
    high = min(low + 1, len(ordered) - 1)
    return ordered[low] + (ordered[high] - ordered[low]) * (rank - low)


def percentiles(values: list[float], qs=PERCENTILES) -> dict[str, float | None]:
    """{"p50": ..., "p95": ..., "p99": ..., "mean": ...} of ``values`` (None each when empty)."""
    return {**{f"p{q}": percentile(values, q) for q in qs}, "mean": statistics.fmean(values) if values else None}


@dataclass(frozen=True)
class Timing:
    """One finished request's latencies, seconds (TPOT None for a single-token output)."""

    ttft: float
    e2e: float
    tpot: float | None
    itl: list[float]
    tokens: int

    @property
    def user_tok_per_s(self) -> float:
        return self.tokens / self.e2e if self.e2e > 0 else 0.0


def timing(chunks: list[list[float]], e2e: float) -> Timing | None:
    """A request's latencies from its chunks ``[[t_after_send, tokens], ...]`` and its end-to-end time; None when
    it streamed no token (a failed or empty request: counted apart, never as a zero latency)."""
    chunks = [c for c in chunks if c[1] > 0]
    if not chunks:
        return None
    tokens = int(sum(n for _, n in chunks))
    ttft = chunks[0][0]
    tpot = (e2e - ttft) / (tokens - 1) if tokens > 1 else None
    itl = [b[0] - a[0] for a, b in zip(chunks, chunks[1:])]
    return Timing(ttft, e2e, tpot, itl, tokens)


@dataclass(frozen=True)
class Slo:
    """A service-level objective per request, milliseconds; None: no limit on that latency."""

    ttft_ms: float | None = None
    tpot_ms: float | None = None

    def met(self, t: Timing) -> bool:
        return ((self.ttft_ms is None or t.ttft * 1e3 <= self.ttft_ms)
                and (self.tpot_ms is None or t.tpot is None or t.tpot * 1e3 <= self.tpot_ms))


def level_summary(requests: list, slo: Slo = Slo()) -> dict:
    """One load level's numbers over its requests (records/requests.Timeline): completed and failed counts,
    the span, throughput (output tokens/s, requests/s), goodput under ``slo``, mean per-user tokens/s and the
    TTFT / TPOT / ITL / E2E percentiles in milliseconds."""
    done = [(r, timing(r.chunks, r.e2e_s)) for r in requests if r.error is None]
    timed = [(r, t) for r, t in done if t is not None]
    failed = len(requests) - len(timed)
    if not timed:
        return {"completed": 0, "failed": failed}
    span = max(r.done_s for r, _ in timed) - min(r.sent_s for r, _ in timed)
    tokens = sum(t.tokens for _, t in timed)
    ms = lambda xs: percentiles([x * 1e3 for x in xs])  # noqa: E731
    return {
        "completed": len(timed), "failed": failed, "span_s": span, "output_tokens": tokens,
        "tok_per_s": tokens / span if span > 0 else None,
        "req_per_s": len(timed) / span if span > 0 else None,
        "goodput_req_per_s": sum(slo.met(t) for _, t in timed) / span if span > 0 else None,
        "slo": {"ttft_ms": slo.ttft_ms, "tpot_ms": slo.tpot_ms},
        "user_tok_per_s": statistics.fmean(t.user_tok_per_s for _, t in timed),
        "ttft_ms": ms([t.ttft for _, t in timed]),
        "tpot_ms": ms([t.tpot for _, t in timed if t.tpot is not None]),
        "itl_ms": ms([gap for _, t in timed for gap in t.itl]),
        "e2e_ms": ms([t.e2e for _, t in timed]),
    }


def timeline_of(record) -> Timeline | None:
    """A served request's timeline (``RunRecord.serving``), or None for a record that was not served."""
    return Timeline.from_dict(record.serving) if getattr(record, "serving", None) else None


def paired_ratios(method: list, baseline: list) -> list[list[float]]:
    """Per prompt (in the order of ``method``), its requests' per-user tokens/s over the baseline's request on the
    same prompt in the same round (the runner's round id: ``<round>:<position>``), both finished (schema.RunRecords
    with ``serving``): one ratio per repeat. Intervals resample prompts, each its repeats' mean (the paired speed-up's
    rule, analysis/metrics.py), so repeats never count as more prompts."""
    theirs = {r.pairing["round"]: timeline_of(r) for r in baseline if r.pairing and timeline_of(r)}
    out: dict[str, list[float]] = {}
    for r in method:
        mine, base = timeline_of(r), theirs.get((r.pairing or {}).get("round"))
        if mine is None or base is None or mine.error or base.error:
            continue
        a, b = timing(mine.chunks, mine.e2e_s), timing(base.chunks, base.e2e_s)
        if a is not None and b is not None and b.user_tok_per_s > 0:
            out.setdefault(r.prompt_id, []).append(a.user_tok_per_s / b.user_tok_per_s)
    return list(out.values())


def prompt_means(ratios: list[list[float]]) -> list[float]:
    """Each prompt's mean over its repeats (``paired_ratios``)."""
    return [statistics.fmean(r) for r in ratios if r]


def crossing(levels: list[float], speedups: list[float]) -> float | None:
    """The first load at which the speed-up falls to 1: interpolated linearly in log(load) between the last level
    above 1 and the next at or below it; the first level when it is already at or below 1 there; None (no
    crossover within the levels) when it never does."""
    for k, (x, s) in enumerate(zip(levels, speedups)):
        if s <= 1:
            if k == 0:
                return x
            x0, s0 = levels[k - 1], speedups[k - 1]
            w = (s0 - 1) / (s0 - s)
            return math.exp(math.log(x0) + w * (math.log(x) - math.log(x0)))
    return None


def crossover(levels: list[float], ratios: list[list[float]], samples: int = 4000, seed: int = 0) -> dict:
    """The load (concurrency or arrival rate, ``levels`` ascending) at which speculation stops paying, from each
    level's paired ratios, one per prompt (``prompt_means``): its point estimate (``crossing`` of the levels' mean
    ratios, None: no crossover within the levels) and a 95% percentile bootstrap interval (each level's prompts
    resampled on their own). A resample
    that never crosses lies beyond the last level: an interval end there is None, and ``beyond`` is the share of
    such resamples. Levels without ratios are left out."""
    kept = [(x, r) for x, r in zip(levels, ratios) if r]
    if not kept:
        return {"crossover": None, "ci95": None, "levels": []}
    xs = [x for x, _ in kept]
    point = crossing(xs, [statistics.fmean(r) for _, r in kept])
    rng = random.Random(seed)
    resampled = sorted(math.inf if c is None else c for c in (
        crossing(xs, [statistics.fmean(rng.choices(r, k=len(r))) for _, r in kept]) for _ in range(samples)))
    low, high = (resampled[int(q * (samples - 1))] for q in (0.025, 0.975))
    beyond = sum(c == math.inf for c in resampled) / samples
    return {"crossover": point, "ci95": [None if low == math.inf else low, None if high == math.inf else high],
            "beyond": beyond, "levels": xs}


def by_batch(records: list) -> list[list[Timeline]]:
    """Served records' timelines, one list per level pass (``batch.id``: a round's requests to one server, their
    times relative to that pass's start)."""
    passes: dict[str, list[Timeline]] = {}
    for r in records:
        t = timeline_of(r)
        if t is not None:
            passes.setdefault((r.batch or {}).get("id", ""), []).append(t)
    return list(passes.values())


RATES = ("tok_per_s", "req_per_s", "goodput_req_per_s")


def served(records: list, slo: Slo = Slo()) -> dict:
    """One server's numbers over a run's level passes: the rates (throughput, goodput) of each pass averaged over
    passes, the latency percentiles over every request of every pass."""
    passes = by_batch(records)
    pooled = level_summary([t for p in passes for t in p], slo)
    if not pooled.get("completed"):
        return pooled
    each = [level_summary(p, slo) for p in passes]
    for key in RATES:
        values = [s[key] for s in each if s.get(key) is not None]
        pooled[key] = statistics.fmean(values) if values else None
    pooled["passes"] = len(passes)
    pooled.pop("span_s", None)
    return pooled


def serving_metrics(records: list, baseline_records: list | None, slo: Slo = Slo()) -> dict:
    """A served run's flat numbers, as summaries and reports show them: the method's server's and the baseline's
    throughput, goodput, per-user tokens/s and latency percentiles (ms), the paired per-user speed-up with its
    interval and the throughput ratio (``throughput_ratio``: the mean over rounds of each round's ratio)."""
    mine = served(records, slo)
    out = {"served_tok_per_s": mine.get("tok_per_s"), "goodput": mine.get("goodput_req_per_s"),
           "user_tok_per_s": mine.get("user_tok_per_s"), "served_failed": mine.get("failed")}
    for name in ("ttft", "tpot", "itl", "e2e"):
        for q in ("p50", "p99"):
            out[f"{name}_{q}_ms"] = (mine.get(f"{name}_ms") or {}).get(q)
    if baseline_records:
        base = served(baseline_records, slo)
        out.update(baseline_served_tok_per_s=base.get("tok_per_s"), baseline_goodput=base.get("goodput_req_per_s"),
                   baseline_user_tok_per_s=base.get("user_tok_per_s"),
                   baseline_ttft_p50_ms=(base.get("ttft_ms") or {}).get("p50"),
                   baseline_tpot_p50_ms=(base.get("tpot_ms") or {}).get("p50"))
        ratios = paired_ratios(records, baseline_records)
        out["user_speedup"] = statistics.fmean(prompt_means(ratios)) if ratios else None
        out["user_speedup_ci95"] = bootstrap_mean_ci(ratios)
        out["user_speedup_pairs"] = sum(map(len, ratios))
        out["throughput_ratio"] = throughput_ratio(records, baseline_records, slo)
    return {**out, **server_speculation(records)}


def round_of(record) -> str | None:
    """The runner's round a served record's level pass ran in (its round id without the request's position)."""
    return ((record.pairing or {}).get("round") or "").split(":")[0] or None


def throughput_ratio(records: list, baseline_records: list, slo: Slo = Slo()) -> float | None:
    """The method's server's output tokens/s over the baseline's, pass by pass: the mean over rounds of each round's
    ratio (both servers ran that round's level back to back, so drift between rounds cancels); without rounds in
    common, the ratio of the pass-averaged throughputs."""
    def by_round(recs):
        groups: dict[str, list] = {}
        for r in recs:
            if round_of(r) is not None:
                groups.setdefault(round_of(r), []).append(r)
        return groups

    mine, theirs = by_round(records), by_round(baseline_records)
    ratios = [a / b for a, b in ((served(mine[k], slo).get("tok_per_s"), served(theirs[k], slo).get("tok_per_s"))
                                 for k in mine.keys() & theirs.keys()) if a and b]
    if ratios:
        return statistics.fmean(ratios)
    a, b = served(records, slo).get("tok_per_s"), served(baseline_records, slo).get("tok_per_s")
    return a / b if a and b else None


def server_speculation(records: list) -> dict:
    """What the speculating server itself counted over the run: the share of drafted tokens it accepted and, where
    it counts its drafting steps (vLLM's server-wide totals, one per level in ``batch.server_counters``), its mean
    acceptance length 1 + accepted / steps with a draft (vLLM's own figure: steps that drafted nothing are not in
    it, unlike our τ). llama-server reports drafted and accepted per request (the records' own counts)."""
    levels = {r.batch["id"]: r.batch["server_counters"] for r in records
              if r.batch and r.batch.get("server_counters") is not None}
    if levels:
        drafted = sum(c["drafted"] for c in levels.values())
        accepted = sum(c["accepted"] for c in levels.values())
        steps = sum(c["steps"] for c in levels.values())
    else:
        drafted, accepted, steps = sum(r.drafted for r in records), sum(r.accepted for r in records), 0
    return {"server_acceptance": accepted / drafted if drafted else None,
            "server_accept_length": 1 + accepted / steps if steps else None}
