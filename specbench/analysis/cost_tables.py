"""Forward-cost tables kept between runs, so that a sweep measures the bound's T(k) (costs.py) once, not per job.

A table is one model's ``ForwardCosts`` after a context of c tokens, keyed by everything its numbers depend on: the
pair as it names a run, backend, precision and linear kernel, execution mode, threads and the machine (CPU identity,
host, library versions). ``CostTableStore.costs`` reuses a stored table when

- it is younger than ``max_age_s`` and was measured after a context up to ``context_slack`` tokens shorter than the
  one asked for (a forward's cost changes by ~1% per 100 cached tokens on the embedded pair; never longer: the
  table's blocks must fit where the run's did), and
- the machine still agrees with it. T(1) and T(b), b the largest block the run's records fed (``check_size``), are
  timed again now (with any sizes the table lacks, interleaved in the same passes), and
  * the table's shape holds: T(b)/T(1) now is within ``drift`` (15%) of the kept table's. The bound is a ratio of
    sums of one table's T(k) (greedy's over the method's), and the forwards factor of its split a ratio of ratios,
    so a table that is uniformly slower or faster bounds alike; what would change the bound is its shape;
  * and T(1) is within ``scale_drift`` (30%) of the kept value: beyond that the machine is not in the state the
    table was measured in (another tenant on the memory bus, a throttled core), whatever the shape says.
  Why these sizes and not the prefill anchors 32 and 64 (only to extrapolate prefills, which both sides of the
  ratio have): on the shared Zen 3 T(64) of llama.cpp's Q4 target moved ~21% between the jobs of one sweep while
  T(1) and T(5) held. Why 15% and 30%: there, in one sweep, tables re-timed a few minutes apart showed T(1) at
  -9% and T(11) at -15% (one direction: the machine was faster), and T(1) of tables measured one after each job
  +18% and -15%; a table measured afresh is then no closer to the conditions the run's forwards ran in than a kept
  one within that (the bound's forwards factor shows how far the run's forwards were from the table either way),
  and checking each size on its own re-measured a third of the tables. A check that fails is timed once more and
  the two pooled (the mean of both passes' medians) before a whole table is measured again.

Otherwise the table is measured whole (``measure_forward_costs``) and replaces the stored one. Sizes the stored
table lacks are added to it as timed in the check. What happened is returned for the run's record: ``measured``,
or ``reused`` with the age and the drift seen. Tables live with the machine's other measurements (the noise
calibrations) under ``$SPECBENCH_CACHE/cost_tables/`` (one JSON file per key and model), written whole
(atomically), so parallel jobs of a sweep and later runs in other records folders share them.
"""
from __future__ import annotations

import hashlib
import json
import time
from dataclasses import dataclass
from pathlib import Path

from .costs import ForwardCosts, as_lm, cyclic, measure_forward_costs, time_blocks
from .lossless import as_computed
from ..files import write_json


@dataclass
class CostTableStore:
    root: Path
    identity: dict             # what the tables' numbers depend on (cost_table_identity)
    max_age_s: float = 24 * 3600
    context_slack: int = 32    # tokens: a table after 1,000 tokens serves a run asking for 1,020
    drift: float = 0.15        # T(b)/T(1) now vs stored, relative (why: the module docstring)
    scale_drift: float = 0.30  # T(1) now vs stored, relative
    check_repeats: int = 5     # the re-timing's passes (median): two sizes, so more passes than a whole table's

    def path(self, role: str) -> Path:
        digest = hashlib.sha256(json.dumps({**self.identity, "role": role}, sort_keys=True,
                                           default=str).encode()).hexdigest()[:20]
        return self.root / f"{role}-{digest}.json"

    def load(self, role: str) -> list[dict]:
        try:
            return json.loads(self.path(role).read_text())["tables"]
        except (OSError, ValueError, KeyError):
            return []

    def costs(self, role: str, model, after: list[int], sizes: set[int], repeats: int = 3,
              check_size: int | None = None) -> tuple[ForwardCosts, int, dict]:
        """(table, the context it was measured after, what was done) for ``role``'s model after ``after``: a table
        of ``sizes``; T(1) and T(``check_size``), the largest block the run fed (or the largest kept size below
        it), decide whether a kept table still holds (default: the largest of ``sizes``)."""
        stored = self.load(role)
        now = time.time()
        near = [t for t in stored if 0 <= len(after) - t["context"] <= self.context_slack  # never longer: capacity
                and now - t["measured_at"] <= self.max_age_s]
        because = "no table kept for this context" if not near else ""
        if near:
            table = min(near, key=lambda t: abs(t["context"] - len(after)))
            kept = ForwardCosts({int(k): v for k, v in table["one_row_ms"].items()}, table["row_ms"],
                                {int(r): v for r, v in table["rows_ms"].items()})
            missing = sorted(k for k in sizes if k not in kept.ms)
            largest = check_size or max(sizes)
            checks = sorted({1, max((k for k in kept.ms if k <= largest), default=1)} & set(kept.ms))
            blocks = [(k, 1) for k in sorted(set(checks) | set(missing))]
            lm, context = as_lm(model), cyclic(after, table["context"])
            passes = max(repeats, self.check_repeats)
            timed = time_blocks(lm, context, blocks, passes)
            drifts, scale, shape, holds = self.compare(kept, timed, checks)
            if not holds:  # once more, pooled: one noisy pass of a shared machine's should not cost a whole table
                again = time_blocks(lm, context, [(k, 1) for k in checks], passes)
                timed = {**timed, **{b: (timed[b] + again[b]) / 2 for b in again}}
                drifts, scale, shape, holds = self.compare(kept, timed, checks)
            if holds:
                kept.ms.update({k: timed[(k, 1)] for k in missing})
                if missing:
                    self.save(role, stored, table["context"], kept, table["measured_at"])
                return kept, table["context"], {"tables": "reused", "age_s": round(now - table["measured_at"]),
                                                "drift": drifts, "shape_drift": shape, "added": missing}
            because = (f"T(1) now differs from the kept table's by more than {self.scale_drift:.0%}: {drifts}"
                       if abs(scale) > self.scale_drift else
                       f"T(k)/T(1) now differs from the kept table's by more than {self.drift:.0%}: {shape}")
        fresh = measure_forward_costs(model, after, sizes, repeats=repeats)
        self.save(role, stored, len(after), fresh, now)
        return fresh, len(after), {"tables": "measured", "because": because}

    def compare(self, kept: ForwardCosts, timed: dict, checks: list[int]) -> tuple[dict, float, dict, bool]:
        """(drift of each checked size, T(1)'s, the shape's: T(k)/T(1) now over kept, whether the table holds)."""
        drifts = {k: round(timed[(k, 1)] / kept.ms[k] - 1, 4) for k in checks}
        scale = drifts.get(1, 0.0)
        shape = {k: round((1 + d) / (1 + scale) - 1, 4) for k, d in drifts.items() if k != 1}
        holds = abs(scale) <= self.scale_drift and all(abs(d) <= self.drift for d in shape.values())
        return drifts, scale, shape, holds

    def save(self, role: str, stored: list[dict], context: int, costs: ForwardCosts, measured_at: float) -> None:
        tables = [t for t in stored if t["context"] != context]
        tables.append({"context": context, "measured_at": measured_at, **costs.as_record()})
        self.root.mkdir(parents=True, exist_ok=True)
        write_json(self.path(role), {"identity": self.identity, "role": role, "tables": tables})


def cost_table_identity(model: dict, pair, threads: int) -> dict:
    """What a pair's forward costs depend on: the pair as it names a run, how it computes (precision, linear kernel,
    execution, backend and its build), threads, and the machine (CPU identity, host, library versions)."""
    import platform

    from ..environment import cpu_identity, package_versions
    from ..backends.execution import model_identity

    return {"model": model_identity(model), "backend": pair.backend,
            "precision": as_computed(pair.precision.as_record()), "execution": as_computed(pair.execution.as_record()),
            "threads": threads, "cpu": cpu_identity(),
            "host": platform.node(), "versions": package_versions(),
            "build": as_computed(pair.info.get("backend")) if pair.backend == "llamacpp" else None}
