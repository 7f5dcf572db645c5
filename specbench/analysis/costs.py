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
of the bound. Each forward costs what its rows of logits cost too (``ForwardCosts``): a prefill keeps one row, a
verify block all of them.
"""
from __future__ import annotations

import statistics
from bisect import bisect_left
from dataclasses import dataclass, field

from ..backends.torch.cached_lm import CachedLM
from ..decoding.generation import ROLES
from ..timing import Stopwatch

TABLE_SIZES = (1, 2, 3, 4, 5, 6, 7, 8, 12, 16, 24, 32)
EXTRA_SIZES = (48, 64, 128, 256, 512)  # prefill-sized blocks, only to predict prefills
MEASURED_UP_TO = 64  # run_bound measures every block size a run fed up to this (Ouroboros' draft feeds 25-50)
ANCHORS = {1, 32, MEASURED_UP_TO}  # and these, to extrapolate prefills
ROW_COUNTS = (2, 3, 5, 8, 12, 16, 20, 24, 32)  # rows of logits timed on the probe block (the lm head's cost curve)
MIN_CONTEXT_GAP = 256  # a run reaching this much past its first prompt also gets a table after its longest context


def time_blocks(lm, prompt: list[int], blocks: list[tuple[int, int]], repeats: int = 3) -> dict[tuple, float]:
    """ms per forward of each (k tokens, rows of logits kept) block after ``prompt``, the cache cropped back to the
    prompt after each: the median of ``repeats`` passes over all blocks (after one warm pass), blocks interleaved
    within a pass so that a load change on the machine hits every block alike instead of skewing their ratios.
    ``lm`` is left empty, as it came: a second call on it (a kept table's re-check) reads the prompt at its own
    positions, not after the first call's copy (which, after a long prompt, ran past a llama.cpp context)."""
    watch = Stopwatch(lm.device)
    lm.forward(prompt, keep_last=1)
    times: dict[tuple, list[float]] = {b: [] for b in blocks}
    for _ in range(repeats + 1):
        for k, rows in blocks:
            watch.start()
            lm.forward((prompt * (k // len(prompt) + 1))[-k:], keep_last=rows)
            times[(k, rows)].append(watch.stop())
            lm.crop(len(prompt))
    lm.crop(0)
    return {b: 1000 * statistics.median(t[1:]) for b, t in times.items()}


def cyclic(tokens: list[int], n: int) -> list[int]:
    """``tokens`` repeated to ``n`` tokens: a context to time forwards after (a forward's cost depends on how many
    tokens it attends to, not on which)."""
    return (tokens * (n // max(len(tokens), 1) + 1))[:n]


def as_lm(model):
    """model: a transformers model (eager forwards), or a CachedLM of the execution mode to measure (``pair.lm``:
    static-cache forwards padded to buckets, CUDA graphs, llama.cpp)."""
    return model if hasattr(model, "crop") else CachedLM(model)


def measure_costs(model, prompt: list[int], sizes=TABLE_SIZES + EXTRA_SIZES, repeats: int = 3) -> dict[int, float]:
    """T(k): ms per forward of k tokens after ``prompt`` (``time_blocks``), keeping logits of all k rows up to
    32 tokens (a verify block) and one row past that (a prefill)."""
    blocks = [(k, k if k <= max(TABLE_SIZES) else 1) for k in sizes]
    return {k: ms for (k, _), ms in time_blocks(as_lm(model), prompt, blocks, repeats).items()}


@dataclass
class ForwardCosts:
    """One model's forward costs as a run's bound reads them: ``ms[k]`` one forward of k tokens keeping ONE row of
    logits, ``row_ms`` each further row kept (the lm head over a vocabulary of ~150k is ~15% of a 1.5B model's
    per-token cost and ~25% of a 0.5B one's, so a 40-token draft block with all rows and a 40-token prefill with one
    differ by that much). T(k, rows) = T(k) + the head's extra cost for ``rows`` rows over one: ``rows_ms[r]``,
    timed on one probe block for r in ROW_COUNTS and interpolated between them. It is not linear: on llama.cpp
    (the 1.5B target, Zen 5) the 2nd..5th rows cost ~3 ms each, rows 20..32 ~1.1 ms (one row runs the head as a
    matrix-vector product, several as a matrix product); priced at the 32-row average, a 5-token verify's logits
    looked 60% cheaper than they are. ``row_ms`` (that average) prices rows where no curve was measured (summaries
    written before it)."""

    ms: dict[int, float]
    row_ms: float = 0.0
    rows_ms: dict[int, float] = field(default_factory=dict)  # r -> ms of r rows of logits over one row (r > 1)

    def at(self, k: int, rows: int | None = None, context: int | None = None) -> float:
        """ms of a forward of k tokens keeping ``rows`` rows of logits (None: all k); one table has one context."""
        rows = k if rows is None else rows
        if rows <= 1:
            return interpolate(self.ms, k)
        extra = interpolate({1: 0.0, **self.rows_ms}, rows) if self.rows_ms else (rows - 1) * self.row_ms
        return interpolate(self.ms, k) + extra

    def as_record(self) -> dict:
        return {"one_row_ms": self.ms, "row_ms": self.row_ms, "rows_ms": self.rows_ms}


@dataclass
class ContextCosts:
    """One model's ``ForwardCosts`` measured after prompts of two lengths (``contexts``, ascending): a forward is
    priced at the cache length it ran after (records' ``forward_contexts``), linearly between the two tables and
    as the nearer one outside them; a forward whose context is not recorded, as the table measured after the run's
    own prompt (the first: what every forward cost before contexts were recorded). On 2 Zen 5 cores (llama.cpp,
    the 1.5B target) T(1) is 17% and T(19) 10% dearer after 1300 cached tokens than after 47."""

    tables: list[ForwardCosts]  # [after the run's prompt, after its longest context]
    contexts: list[int]

    def at(self, k: int, rows: int | None = None, context: int | None = None) -> float:
        (lo, hi), (c0, c1) = self.tables, self.contexts
        if context is None:
            return lo.at(k, rows)
        w = min(1.0, max(0.0, (context - c0) / (c1 - c0)))
        return (1 - w) * lo.at(k, rows) + w * hi.at(k, rows)


def measure_forward_costs(model, prompt: list[int], sizes, repeats: int = 3, probe: int = 32) -> ForwardCosts:
    """``ForwardCosts`` of one model: every size keeping one row, and the ``probe``-token block keeping r rows for r
    in ROW_COUNTS up to ``probe`` (all of them last), all timed interleaved; rows_ms[r] = T(probe, r) - T(probe, 1),
    made non-decreasing in r (more rows never cost less: what noise says otherwise is noise); row_ms = the
    average over all probe rows, at least 0."""
    counts = sorted({r for r in ROW_COUNTS if 1 < r < probe} | {probe})
    blocks = [(k, 1) for k in sorted(set(sizes) | {probe})] + [(probe, r) for r in counts]
    ms = time_blocks(as_lm(model), prompt, blocks, repeats)
    rows_ms, most = {}, 0.0
    for r in counts:
        most = max(most, ms[(probe, r)] - ms[(probe, 1)])
        rows_ms[r] = most
    return ForwardCosts({k: v for (k, rows), v in ms.items() if rows == 1}, rows_ms[probe] / (probe - 1), rows_ms)


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


def predicted_ms(records: list, target_costs, draft_costs, head_costs=None) -> float:
    """Σ over the records' forwards of T(tokens fed) for the model that ran them (target, draft model, draft head).
    costs: a ``ForwardCosts`` (the rows of logits each forward kept, ``forward_rows``, priced; all rows where a
    record does not say), a ``ContextCosts`` (each forward priced at its ``forward_contexts`` too) or a plain table
    {k: ms} from ``measure_costs``."""
    roles = [(role, costs if isinstance(costs, (ForwardCosts, ContextCosts)) else ForwardCosts(costs))
             for role, costs in zip(ROLES, (target_costs, draft_costs, head_costs)) if costs]  # a plain table: no rows
    total = 0.0
    for r in records:
        sizes, rows, contexts = r.forward_sizes or {}, r.forward_rows or {}, r.forward_contexts or {}
        for role, costs in roles:
            fed = sizes.get(role, [])
            unknown = [None] * len(fed)
            total += sum(costs.at(k, n, c) for k, n, c in zip(fed, rows.get(role) or unknown,
                                                              contexts.get(role) or unknown))
    return total


def bound(records: list, baseline: list, target_costs, draft_costs, head_costs=None) -> float | None:
    """Speed-up allowed by the forward costs alone, in the unit of the measured speed-up it is compared with (tokens per
    second, ``metrics.rate``, Σ over Σ): the method's tokens over its predicted time, over the baseline's tokens over
    its predicted time (same prompts). Where both emitted the same tokens this is predicted baseline time / predicted
    method time. Where they did not (a near-tie flipped in bf16 or GGUF and one stopped earlier), a ratio of times
    would be compared with a ratio of rates: a method that stopped at 80 tokens where greedy ran 128 after a
    1300-token prefill is measured at ~0.6 of its time ratio, and its efficiency read 0.83 where its forwards
    explained 0.96 of it. Records without token counts (hand-built) count as equal."""
    method_ms = predicted_ms(records, target_costs, draft_costs, head_costs)
    base_ms = predicted_ms(baseline, target_costs, draft_costs, head_costs)
    if method_ms <= 0 or base_ms <= 0:
        return None
    ours, theirs = (sum(r.new_tokens or 0 for r in side) for side in (records, baseline))
    return base_ms / method_ms * (ours / theirs if ours and theirs else 1.0)


def timed_side(records: list, target_costs, draft_costs, head_costs=None) -> dict | None:
    """One side's forwards as timed in the run (``forward_ms``, timing.ForwardClock) against the cost table and its
    wall time: {"wall_ms", "forward_ms", "predicted_ms", "vs_table": forward_ms / predicted_ms, "forward_share":
    forward_ms / wall_ms}. None where a record has forwards without times (a GPU, vLLM, records from before them)."""
    timed = 0.0
    for r in records:
        sizes, times = r.forward_sizes or {}, r.forward_ms or {}
        if any(fed and len(times.get(role) or ()) != len(fed) for role, fed in sizes.items()):
            return None
        timed += sum(sum(times.get(role) or ()) for role in sizes)
    wall = 1000 * sum(r.wall_s or 0.0 for r in records)
    predicted = predicted_ms(records, target_costs, draft_costs, head_costs)
    if not records or timed <= 0 or wall <= 0 or predicted <= 0:
        return None
    return {"wall_ms": wall, "forward_ms": timed, "predicted_ms": predicted, "vs_table": timed / predicted,
            "forward_share": timed / wall}


def forward_split(records: list, baseline: list, target_costs, draft_costs, head_costs=None) -> dict | None:
    """Efficiency (measured speed-up / bound) as two factors whose product it is, from each forward's wall time in
    the run (``forward_ms``): efficiency = (G_wall / G_pred) / (M_wall / M_pred) for the method M and its paired
    baseline G (the token counts cancel), and each side's wall = its forwards' time / their share of it, so
      forwards = (G_fwd / G_pred) / (M_fwd / M_pred)   the method's forwards against the table, relative to greedy's
                                                         (< 1: its forwards ran slower in the loop than when tabled)
      host     = (G_wall / G_fwd) / (M_wall / M_fwd)   the method's own work between forwards, relative to greedy's
                                                         (drafting on the host, tree building, sampling, Python).
    None where either side's forwards were not timed."""
    method = timed_side(records, target_costs, draft_costs, head_costs)
    base = timed_side(baseline, target_costs, draft_costs, head_costs)
    if method is None or base is None:
        return None
    return {"forwards": base["vs_table"] / method["vs_table"], "host": method["forward_share"] / base["forward_share"],
            "method": method, "baseline": base}


def efficiency(speedup_total: float | None, limit: float | None) -> float | None:
    """How much of the bound the run reached: its measured Σtokens/Σtime speed-up over the bound, which is a
    Σ-over-Σ prediction for the same records (like for like; docs/design.md, *The bound and efficiency*). The one
    definition: the run's summary, the reports' repricing and ``make bench`` all call it."""
    return speedup_total / limit if speedup_total and limit else None


def repriced(run_bound: dict | None, records, baseline, speedup_total) -> dict | None:
    """A run's bound (``run_bound``: each model's T(k), measured once after the run) priced on ``records`` (a run's,
    or some of them: one category's, the prompts a report selects) and their paired baseline records, with
    efficiency = measured Σ/Σ speed-up / bound (as summaries.finish). Reports price from the run's cost tables
    instead of reading the bound the run printed, so the records they select and this module's definition are
    what the numbers mean. None without cost tables or a baseline."""
    from .metrics import matched_baseline

    if not run_bound or not run_bound.get("target_ms") or not baseline:
        return None
    paired = matched_baseline(records, baseline)
    costs = [stored_costs(run_bound, role) for role in ROLES]
    limit = bound(records, paired, *costs)
    if limit is None:
        return None
    return {**run_bound, "bound": limit, "efficiency": efficiency(speedup_total, limit),
            "split": forward_split(records, paired, *costs)}


def stored_costs(run_bound: dict, role: str):
    """One model's costs as ``run_bound`` stores them: ``<role>_ms`` / ``<role>_row_ms`` after the run's prompt,
    and, where the run reached a long context, the same under ``long_context`` (then a ``ContextCosts``)."""
    def table(d):
        ms, curve = d.get(f"{role}_ms"), d.get(f"{role}_rows_ms") or {}
        return ForwardCosts({int(k): v for k, v in ms.items()}, d.get(f"{role}_row_ms") or 0.0,
                            {int(r): v for r, v in curve.items()}) if ms else None

    near, far = table(run_bound), table(run_bound.get("long_context") or {})
    if near is None or far is None:
        return near
    return ContextCosts([near, far], [run_bound["prompt_tokens"], run_bound["long_context"]["prompt_tokens"]])


def long_context(records, prompt_tokens: int) -> int | None:
    """Where to measure a second table: the furthest a decode-sized forward (<= MEASURED_UP_TO tokens) of these
    records reached, less MEASURED_UP_TO (the table's blocks then fit wherever the run's did: llama.cpp's and the
    static cache's capacity); None when that is within MIN_CONTEXT_GAP tokens or twice the run's prompt."""
    reach = [c + k for r in records for role in ("target", "draft")
             for k, c in zip((r.forward_sizes or {}).get(role, []), (r.forward_contexts or {}).get(role, []))
             if k <= MEASURED_UP_TO]
    far = max(reach, default=0) - MEASURED_UP_TO
    return far if far >= max(2 * prompt_tokens, prompt_tokens + MIN_CONTEXT_GAP) else None


def verify_table(costs: ForwardCosts) -> dict[int, float]:
    """T(k) of a verify block (all k rows of logits) over the table sizes: what ``make bench`` prints."""
    return {k: costs.at(k) for k in TABLE_SIZES}


def run_bound(pair, records: list, baseline: list, prompt: list[int], repeats: int = 3,
              draft=None, head=None, store=None) -> dict | None:
    """The bound of one run (what ``python -m specbench`` prints beside the speed-up): forward costs measured now,
    after the timed generations, on this pair and machine (``measure_forward_costs``): every block size up to 64
    the records fed, and 1, 32, 64 of each model; larger blocks, i.e. prefills, are extrapolated linearly from
    T(32)..T(64), as llama.cpp's and torch's compute-bound prefills scale, which underestimates long prefills by
    ~10-15%: both sides of the ratio have them. Each forward is priced with the rows of logits it kept, and at the
    context it ran after: where the records reach far past ``prompt`` (``long_context``), every table is measured
    again after that many tokens (stored under ``long_context``) and forwards are priced between the two. Then
    ``bound`` over the method's records and their paired baseline records. draft: the model that ran the records'
    draft forwards when it is not the pair's draft (a method drafting with part of the target: swift's
    layer-skipped target, ``self_draft``; a model: each table times a fresh CachedLM around it). head: a draft
    head's forwards as a model (``head_cost_probe``: EAGLE's layer, Medusa's heads), timed over the block sizes
    the records' ``head`` forwards fed (after the prompt only); without it those forwards are not priced (the bound
    is then higher than the forwards allow). store: a ``cost_tables.CostTableStore``: the pair's target and draft
    tables are reused from earlier runs on this machine where they still hold (each table says, ``cost_tables``);
    None measures them all. The tables' context is the one they were measured after (``prompt_tokens``).
    None without a baseline or forward sizes (engine=vllm)."""
    from .metrics import matched_baseline

    base = matched_baseline(records, baseline) if baseline else []
    fed = {role: {k for r in records + base for k in (r.forward_sizes or {}).get(role, [])
                  if k <= MEASURED_UP_TO} for role in ROLES}
    if not base or not fed["target"]:
        return None
    # the largest block each model fed after a turn's prefill (a verify or draft block): with T(1), what a kept
    # table is checked on (cost_tables.CostTableStore)
    decoded = {role: max((k for r in records + base for turn in r.turn_list
                          for k in turn.forward_sizes.get(role, [])[1:] if k <= MEASURED_UP_TO), default=1)
               for role in ROLES}

    def measured(role: str, model, after: list[int], sizes: set[int]) -> tuple[ForwardCosts, int, dict]:
        if store is None or (role == "draft" and draft is not None):  # a self-draft is this run's own
            return measure_forward_costs(model, after, sizes, repeats=repeats), len(after), {"tables": "measured"}
        # a kept table holds if T(1) and the largest block this run fed still time as it says (cost_tables)
        return store.costs(role, model, after, sizes, repeats, check_size=decoded[role])

    def tables(after: list[int]) -> dict:
        """T(k) of the target and the draft after ``after`` (or after as many tokens as a kept table was measured
        after), each from an empty cache (a fresh pair.lm, or a CachedLM made around ``draft``), as the summary
        stores them."""
        target, context, how = measured("target", pair.lm("target"), after, fed["target"] | ANCHORS)
        near, done = {"target": target}, {"target": how}
        if fed["draft"] and (draft is not None or pair.draft is not None):
            drafter = draft if draft is not None else pair.lm("draft")
            near["draft"], _, done["draft"] = measured("draft", drafter, cyclic(after, context), fed["draft"] | ANCHORS)
        return {**{key: value for role, costs in near.items() for key, value in
                   ((f"{role}_ms", costs.ms), (f"{role}_row_ms", costs.row_ms), (f"{role}_rows_ms", costs.rows_ms))},
                "prompt_tokens": context, "cost_tables": done}

    result = {"draft_ms": None, "draft_row_ms": None, **tables(prompt)}
    if fed["head"] and head is not None:
        probe = measure_forward_costs(head, prompt, fed["head"] | {1}, repeats=repeats)
        result.update(head_ms=probe.ms, head_row_ms=probe.row_ms, head_rows_ms=probe.rows_ms)
    far = long_context(records + base, len(prompt))
    if far is not None:
        result["long_context"] = tables(cyclic(prompt, far))
    costs = [stored_costs(result, role) for role in ROLES]
    limit = bound(records, base, *costs)
    if limit is None:
        return None
    verify = max((k for r in records for turn in r.turn_list for k in turn.forward_sizes.get("target", [])[1:]
                  if 1 < k <= MEASURED_UP_TO), default=None)  # the largest verify block (not a prompt's), T(k)/T(1)
    near = ForwardCosts(result["target_ms"], result["target_row_ms"], result["target_rows_ms"])  # after the prompt
    return {"bound": limit, **result, "split": forward_split(records, base, *costs),
            "verify_ratio": {"k": verify, "ratio": near.at(verify) / near.at(1)} if verify else None}
