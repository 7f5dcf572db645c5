"""Spec-Bench's table (Xia et al. 2024, github.com/hemingkx/Spec-Bench, Leaderboard.md): each method's speed-up on
each of the six categories and overall, and τ (mean tokens accepted per step), ours beside the leaderboard's.

One run of a method covers every category (``data=spec_bench``: each record carries its prompt's ``category``);
``experiment.split_by: category`` makes the report split each run's records by category into one table entry per
(category, method), plus the ``overall`` entry over all of them. Each category's speed-up is computed as every
other speed-up here (metrics.summarize: paired with greedy prompt by prompt), and its bound and efficiency from the
forward costs T(k) the run measured after its last round (its summary's ``bound``: costs.run_bound), priced on that
category's forwards only (costs.repriced). The leaderboard's numbers (published/spec_bench.csv) are one setting of it,
picked by ``experiment.published_where``; its τ is overall only.

Where we differ: Spec-Bench's speed-up is the mean tok/s over all prompts of the method over that of greedy, each
timed in a separate pass (evaluation/speed.py); ours is the mean of per-prompt paired ratios (design.md).
"""
from __future__ import annotations

from dataclasses import replace
from pathlib import Path

from ..costs import repriced
from ..errors import ConfigError
from ..metrics import summarize
from ..scoring import primary_value
from .experiment import Cell, Experiment
from .figure_files import save
from .paper import cell_entry
from .tables import Entry, label_for

CATEGORIES = ("mt_bench", "translation", "summarization", "qa", "math_reasoning", "rag")  # Spec-Bench's order
OVERALL = "overall"
KEY = "category"      # the row key naming a category (a record field, not a config key)
UNCATEGORISED = "(no category)"  # records written before records carried their prompt's category


def category_entries(exp: Experiment) -> list[Entry]:
    """Our entries: per cell, one per category its records hold (or its data.categories select, when it has no
    records yet: each then says why), then ``overall``."""
    if exp.spec.get("split_by") != KEY:
        raise ConfigError(f"experiment.split_by: {exp.spec.get('split_by')!r}: only 'category' is supported")
    keys = [k for k in exp.keys if k != KEY]
    entries = []
    for cell in exp.cells:
        if cell.status != "ok":
            selected = list(cell.value("data.categories") or CATEGORIES)
            base = cell_entry(exp.spec, cell, keys)
            entries += [replace(base, keys={**base.keys, KEY: c}) for c in [*selected, OVERALL]]
            continue
        present = {r.category or UNCATEGORISED for r in cell.records}
        order = [c for c in CATEGORIES if c in present] + sorted(present - set(CATEGORIES))
        for category in order:
            entries.append(category_entry(exp.spec, cell, keys, category))
        overall = cell_entry(exp.spec, cell, keys)
        entries.append(replace(overall, keys={**overall.keys, KEY: OVERALL}))
    return entries


def category_entry(spec, cell: Cell, keys: list[str], category: str) -> Entry:
    """The cell's numbers on one category's records: summarised like a whole run, with the bound re-priced."""
    records = [r for r in cell.records if (r.category or UNCATEGORISED) == category]
    prompts = {r.prompt_id for r in records}
    baseline = [b for b in cell.baseline_records if b.prompt_id in prompts]
    is_baseline = cell.baseline.key == cell.spec.key
    summary = summarize(records, baseline or None, exact=cell.cfg.sampling.temperature == 0, is_baseline=is_baseline)
    summary["accuracy_primary"] = primary_value(summary.get("accuracy"))
    summary["bound"] = repriced(cell.summary.get("bound"), records, baseline, summary.get("speedup_total"))
    part = replace(cell, records=records, baseline_records=baseline, summary=summary)
    entry = cell_entry(spec, part, keys)
    entry.keys = {**entry.keys, KEY: category}
    return entry


def speedup_by_category(exp: Experiment, out_dir: Path) -> list[Path]:
    """Speed-up per category (and overall) per method: ours in one panel, the leaderboard's setting in the other."""
    from matplotlib import colormaps
    from matplotlib.figure import Figure


    panels = {"ours": bars(exp.entries), f"paper ({exp.spec.get('published_where', {}).get('setting', '')})":
              bars(exp.published)}
    if not panels["ours"]:
        return []
    fig = Figure(figsize=(11, 3.8))
    axes = fig.subplots(1, 2, sharey=True)
    categories = [*CATEGORIES, OVERALL]
    top = max(v for speed in panels.values() for v in speed.values())
    every = list(dict.fromkeys(m for speed in panels.values() for _, m in speed))  # one colour per method in both
    colour = {m: colormaps["tab20"](i % 20) for i, m in enumerate(every)}
    for ax, (title, speed) in zip(axes, panels.items()):
        methods = list(dict.fromkeys(m for _, m in speed))
        width = 0.8 / max(len(methods), 1)
        for j, method in enumerate(methods):
            xs = [i + (j - (len(methods) - 1) / 2) * width for i, c in enumerate(categories) if (c, method) in speed]
            ys = [speed[(c, method)] for c in categories if (c, method) in speed]
            ax.bar(xs, ys, width, label=label_for(exp.spec, "method.name", method), color=colour[method])
        ax.axhline(1.0, color="grey", linewidth=0.8)
        ax.set_xticks(range(len(categories)), [label_for(exp.spec, KEY, c) for c in categories], rotation=30,
                      ha="right", fontsize=7)
        ax.set_title(title, fontsize=8)
        ax.set_ylabel("speed-up over greedy (×)")
        ax.grid(axis="y", alpha=0.3)
        ax.set_ylim(0, top * 1.5)  # room above the bars for the legend
        if methods:
            ax.legend(fontsize=6, ncol=3, loc="upper center")
    fig.suptitle(exp.spec.get("title", exp.name), fontsize=8)
    return save(fig, out_dir, "speedup_by_category")


def bars(entries: list[Entry]) -> dict[tuple, float]:
    """(category, method) -> speed-up, of the entries that have a number."""
    return {(e.keys.get(KEY), e.keys.get("method.name")): e.values["speedup"] for e in entries
            if e.status == "ok" and isinstance(e.values.get("speedup"), (int, float))}
