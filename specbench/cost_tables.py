"""Forward-cost tables kept between runs, so that a sweep measures the bound's T(k) (costs.py) once, not per job.

A table is one model's ``ForwardCosts`` after a context of c tokens, keyed by everything its numbers depend on: the
pair as it names a run, backend, precision and linear kernel, execution mode, threads and the machine (CPU identity,
host, library versions). ``CostTableStore.costs`` reuses a stored table when

- it is younger than ``max_age_s`` and was measured after a context up to ``context_slack`` tokens shorter than the
  one asked for (a forward's cost changes by ~1% per 100 cached tokens on the embedded pair; never longer: the
  table's blocks must fit where the run's did), and
- the machine still agrees with it: T(1) and T of the largest block the run's records fed (``check``: the sizes
  that carry the bound; the anchors 32 and 64 only extrapolate prefills, which both sides of its ratio have) are
  timed again now (with any sizes the table lacks, interleaved in the same passes) and each is within ``drift``
  (15%) of the stored value. Why not the anchors: on the shared Zen 3 T(64) of llama.cpp's Q4 target moved ~21%
  between the jobs of one sweep while T(1) and T(5) stayed within 10%, so checking it re-measured every table and
  the bound cost a third of each job. Why 15%:
  on a shared 2-core Zen 3 (llama.cpp Q4, the embedded target) T(1) of tables measured a few minutes apart, one
  after each job of a sweep, differed by +18% and -15%; a table measured afresh is then no closer to the
  conditions the run's forwards ran in than a kept one within that (the bound's forwards factor shows how far the
  run's forwards were from the table either way).

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
from .records import write_json


@dataclass
class CostTableStore:
    root: Path
    identity: dict             # what the tables' numbers depend on (cost_table_identity)
    max_age_s: float = 24 * 3600
    context_slack: int = 32    # tokens: a table after 1,000 tokens serves a run asking for 1,020
    drift: float = 0.15        # relative: T(1) and T(k_max) now vs stored (why 15%: the module docstring)
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
              check: set[int] | None = None) -> tuple[ForwardCosts, int, dict]:
        """(table, the context it was measured after, what was done) for ``role``'s model after ``after``: a table
        of ``sizes``; ``check``: the sizes whose re-timing decides whether a kept table still holds (default T(1)
        and the largest of ``sizes``)."""
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
            checks = sorted((check or {1, max(sizes)}) & set(kept.ms))
            blocks = [(k, 1) for k in sorted(set(checks) | set(missing))]
            timed = time_blocks(as_lm(model), cyclic(after, table["context"]), blocks, max(repeats, self.check_repeats))
            drifts = {k: round(timed[(k, 1)] / kept.ms[k] - 1, 4) for k in checks}
            if all(abs(d) <= self.drift for d in drifts.values()):
                kept.ms.update({k: timed[(k, 1)] for k in missing})
                if missing:
                    self.save(role, stored, table["context"], kept, table["measured_at"])
                return kept, table["context"], {"tables": "reused", "age_s": round(now - table["measured_at"]),
                                                "drift": drifts, "added": missing}
            because = f"T(k) now differs from the kept table's by more than {self.drift:.0%}: {drifts}"
        fresh = measure_forward_costs(model, after, sizes, repeats=repeats)
        self.save(role, stored, len(after), fresh, now)
        return fresh, len(after), {"tables": "measured", "because": because}

    def save(self, role: str, stored: list[dict], context: int, costs: ForwardCosts, measured_at: float) -> None:
        tables = [t for t in stored if t["context"] != context]
        tables.append({"context": context, "measured_at": measured_at, **costs.as_record()})
        self.root.mkdir(parents=True, exist_ok=True)
        write_json(self.path(role), {"identity": self.identity, "role": role, "tables": tables})


def cost_table_identity(model: dict, pair, threads: int) -> dict:
    """What a pair's forward costs depend on: the pair as it names a run, how it computes (precision, linear kernel,
    execution, backend and its build), threads, and the machine (CPU identity, host, library versions)."""
    import platform

    from .environment import cpu_identity, package_versions
    from .models.execution import model_identity

    return {"model": model_identity(model), "backend": pair.backend, "precision": pair.precision.as_record(),
            "execution": pair.execution.as_record(), "threads": threads, "cpu": cpu_identity(),
            "host": platform.node(), "versions": package_versions(),
            "build": pair.info.get("backend") if pair.backend == "llamacpp" else None}
