"""Notes under a table about engines: which engine (and version, device) measured the cells, how batched numbers
are read, and ``experiment.parity``: the same cells measured two ways, side by side in one line.

``experiment.parity`` = {key, ours, reference, tolerance}: ``key`` is a config key the sweep varies (e.g.
``engine.name``), ``ours`` and ``reference`` two of its values. For every group of cells equal in all other keys,
one line gives our tok/s (speculative and greedy) as a fraction of the reference's, and the relative differences
of τ and acceptance, each against ``tolerance`` (0.10: within ±10%, as expected at T=0 of one pair and method).
"""
from __future__ import annotations

from .tables import METRICS, Entry, label_for, number_text

SPEEDS = (("tok_per_s", "tok/s"), ("baseline_tok_per_s", "greedy tok/s"))   # compared as ratios
AGREEMENT = ("tau", "acceptance_rate")                                       # compared as relative differences
BATCHED = ("batch_tok_per_s", "baseline_batch_tok_per_s", "throughput_speedup")  # numbers of whole batches


def engine_notes(exp) -> list[str]:
    """One line per engine that reported itself (engine=vllm summaries: ``engine``, ``device``), and how batched
    numbers read when the table shows some and a cell was measured in batches."""
    notes = []
    for cell in exp.cells:
        s = cell.summary
        if cell.status == "ok" and s.get("engine"):
            line = f"ours: engine={cell.value('engine.name')} ran {s['engine']}" + (
                f" on {s['device']}" if s.get("device") else "")
            if line not in notes:
                notes.append(line)
    sizes = sorted({c.value("runner.batch_size") for c in exp.cells
                    if c.status == "ok" and c.summary.get("batch_tok_per_s") is not None})
    if sizes and any(m in BATCHED for m in exp.spec.metrics):
        notes.append(f"ours: batched runs (runner.batch_size {', '.join(map(str, sizes))}): throughput is Σ tokens "
                     "of whole batches / Σ their wall times; its speed-up the mean over batches of the ratio to "
                     "greedy's batch timed in the same round, with a 95% bootstrap interval over batches; tok/s "
                     "and latency speed-up are per request (its latency inside its batch)")
    return notes


def relative(value, reference) -> float | None:
    if not isinstance(value, (int, float)) or not isinstance(reference, (int, float)) or not reference:
        return None
    return (value - reference) / reference


def parity(exp) -> tuple[list[str], list[dict]]:
    """(note lines, tidy CSV rows) for ``experiment.parity``; nothing when the experiment has none."""
    p = exp.spec.get("parity")
    if not p:
        return [], []
    key, tolerance = p.key, p.get("tolerance", 0.10)
    others = [k for k in exp.keys if k != key]
    groups: dict[tuple, dict] = {}
    for e in exp.entries:
        groups.setdefault(tuple(e.keys.get(k) for k in others), {})[e.keys.get(key)] = e
    ours, reference = label_for(exp.spec, key, p.ours), label_for(exp.spec, key, p.reference)
    notes, tidy = [], []
    for group, by_value in groups.items():
        where = dict(zip(others, group))
        name = ", ".join(label_for(exp.spec, k, v) for k, v in where.items())
        mine, theirs = by_value.get(p.ours), by_value.get(p.reference)
        if not measured(mine) or not measured(theirs):
            notes.append(f"parity ({name}): {ours} against {reference} needs both measured")
            continue
        parts = []
        for metric, what in SPEEDS:
            change = relative(mine.values.get(metric), theirs.values.get(metric))
            if change is not None:  # ours / reference = 1 + change
                parts.append(f"{ours} {what} is {1 + change:.2f}× {reference}'s ({text(mine, metric)} vs "
                             f"{text(theirs, metric)})")
                tidy.append(row(where, key, p, f"{metric}_ratio", 1 + change))
        for metric in AGREEMENT:
            diff = relative(mine.values.get(metric), theirs.values.get(metric))
            if diff is not None:
                verdict = "within" if abs(diff) <= tolerance else "OUTSIDE"
                parts.append(f"{METRICS[metric].header} {text(mine, metric)} vs {text(theirs, metric)}: {diff:+.1%} "
                             f"({verdict} ±{tolerance:.0%})")
                tidy.append(row(where, key, p, f"{metric}_relative_difference", diff))
        notes.append(f"parity ({name}): " + "; ".join(parts or ["no comparable numbers"]))
    return notes, tidy


def measured(entry: Entry | None) -> bool:
    return entry is not None and entry.status == "ok"


def text(entry: Entry, metric: str) -> str:
    return number_text(entry.values.get(metric), None, METRICS[metric])


def row(where: dict, key: str, p, metric: str, value: float) -> dict:
    return {**where, key: f"{p.ours}/{p.reference}", "source": "parity", "metric": metric, "value": value}
