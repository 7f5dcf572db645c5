"""DISCO's tables from our runs: Table 1 (latency, speedup), Table 3 + Figure 4 (oracle SL statistics),
Table 5 (F1), Table 6 (DISCO's latency improvement). Markdown for people, CSV/JSON for tools.

The oracle SL of a speculative iteration is the number of draft tokens the target accepted in it (the
oracle drafts exactly the run the target will accept, so it is also the SL drafted, ``extra.sl``, and the
best SL that iteration could have had): per record, ``accept_lengths`` minus the bonus token each step adds.
"""
from __future__ import annotations

import csv
import statistics
from collections import Counter
from pathlib import Path

from ...analysis.metrics import fmt, mean_sl  # noqa: F401  (tables.mean_sl: Table 1's mean SL column)

TABLE1_COLUMNS = ("row", "method", "settings", "ms_per_token", "speedup", "tau", "acceptance_rate",
                  "mean_sl", "identical", "compared", "prompts", "new_tokens")


# DISCO Table 1: (row, method) in the paper's order (+ the ppl baseline of its Table 2)
TABLE1_PLAN = (("Target", "greedy"), ("dynHeur SL", "dyn_heur"), ("static SL-5", "speculative"),
               ("static SL-opt", "speculative"), ("DISCO", "disco"), ("oracle", "oracle_sl"), ("ppl SL-opt", "ppl_sl"))


def oracle_sl_of(record) -> list[int]:
    """Per-step oracle SL of one record: the SL it drafted (``extra.sl``; every drafted token is accepted), or
    for records without it, accepted per step (a step cut at an EOS among the drafts counts one less)."""
    return list(record.extra.get("sl") or [n - 1 for n in record.accept_lengths])


def oracle_statistics(records) -> dict:
    """Per-prompt oracle SL sequences, their mean ± std over all iterations, and the SL histogram."""
    per_prompt = {r.prompt_id: oracle_sl_of(r) for r in records if r.repeat == 0}
    values = [sl for seq in per_prompt.values() for sl in seq]
    counts = Counter(values)
    return {
        "iterations": len(values),
        "mean": statistics.fmean(values) if values else None,
        "std": statistics.stdev(values) if len(values) > 1 else None,
        "histogram": {str(sl): counts[sl] / len(values) for sl in sorted(counts)},
        "per_prompt": per_prompt,
    }


def improvement(ours: float | None, other: float | None) -> float | None:
    """Table 6: latency improvement in percent, (other - ours) / other."""
    return 100 * (other - ours) / other if ours and other else None


def write_csv(path: Path, rows: list[dict], columns) -> None:
    with path.open("w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=list(columns), extrasaction="ignore")
        writer.writeheader()
        writer.writerows(rows)


def table1_markdown(title: str, rows: list[dict]) -> str:
    lines = [f"### {title}", "",
             "| Method | Latency (ms/token) | Speedup | τ | Acceptance | Mean SL | Identical to greedy |",
             "|---|---:|---:|---:|---:|---:|---:|"]
    for r in rows:
        identical = f"{r['identical']}/{r['compared']}" if r.get("compared") else "-"
        name = f"{r['row']} ({r['settings']})" if r.get("settings") else r["row"]
        lines.append(f"| {name} | {fmt(r['ms_per_token'], '.1f')} | {fmt(r['speedup'], '.2f')}x | "
                     f"{fmt(r['tau'], '.2f')} | {fmt(r['acceptance_rate'], '.1%')} | {fmt(r['mean_sl'], '.2f')} | "
                     f"{identical} |")
    by_row = {r["row"]: r["ms_per_token"] for r in rows}
    disco = by_row.get("DISCO")
    gains = [f"{name} {fmt(improvement(disco, by_row.get(name)), '+.1f')}%"
             for name in ("static SL-opt", "dynHeur SL") if name in by_row]
    if disco and gains:
        lines += ["", f"DISCO's latency improvement (Table 6): over {', over '.join(gains)}."]
    return "\n".join(lines) + "\n"


def table3_markdown(title: str, stats: dict) -> str:
    hist = ", ".join(f"{sl}: {p:.2f}" for sl, p in stats["histogram"].items())
    return (f"### {title}\n\n| Oracle SL mean (± std) | Iterations | Prompts |\n|---:|---:|---:|\n"
            f"| {fmt(stats['mean'], '.1f')} (± {fmt(stats['std'], '.1f')}) | {stats['iterations']} | "
            f"{len(stats['per_prompt'])} |\n\nHistogram (oracle SL: probability, its Figure 4): {hist}\n")


def table5_markdown(title: str, evaluation: dict) -> str:
    return (f"### {title}\n\n| F1 static-SL | F1 DISCO | Validation tokens | Accepted fraction |\n"
            f"|---:|---:|---:|---:|\n| {100 * evaluation['f1_static_sl']:.0f} | {100 * evaluation['f1_disco']:.0f} | "
            f"{evaluation['tokens']} | {evaluation['accepted_fraction']:.1%} |\n")
