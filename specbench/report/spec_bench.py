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

from dataclasses import dataclass, replace
from pathlib import Path

from ..analysis.costs import repriced
from ..errors import ConfigError
from ..analysis.metrics import acceptance_by_position, summarize
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
    """Speed-up per category (and overall) per method: ours in one panel (95% intervals as error bars; a cell over
    too little identical work hatched: analysis/identical_work.py), the leaderboard's setting in the other."""
    from matplotlib import colormaps
    from matplotlib.patches import Patch
    from matplotlib.figure import Figure

    panels = {"ours": bars(exp.entries), f"paper ({exp.spec.get('published_where', {}).get('setting', '')})":
              bars(exp.published)}
    if not panels["ours"]:
        return []
    fig = Figure(figsize=(11, 3.8))
    axes = fig.subplots(1, 2, sharey=True)
    categories = [*CATEGORIES, OVERALL]
    top = max(bar.high for speed in panels.values() for bar in speed.values())
    every = list(dict.fromkeys(m for speed in panels.values() for _, m in speed))  # one colour per method in both
    colour = {m: colormaps["tab20"](i % 20) for i, m in enumerate(every)}
    for ax, (title, speed) in zip(axes, panels.items()):
        methods = list(dict.fromkeys(m for _, m in speed))
        width = 0.8 / max(len(methods), 1)
        for j, method in enumerate(methods):
            shown = [(i, speed[(c, method)]) for i, c in enumerate(categories) if (c, method) in speed]
            xs = [i + (j - (len(methods) - 1) / 2) * width for i, _ in shown]
            ax.bar(xs, [b.value for _, b in shown], width, label=label_for(exp.spec, "method.name", method),
                   color=colour[method], hatch=[("//" if b.flagged else "") for _, b in shown], edgecolor="white",
                   linewidth=0.3)
            errors = [(x, b) for x, (_, b) in zip(xs, shown) if b.interval]
            if errors:
                ax.errorbar([x for x, _ in errors], [b.value for _, b in errors],
                            yerr=[[b.value - b.interval[0] for _, b in errors],
                                  [b.interval[1] - b.value for _, b in errors]],
                            fmt="none", ecolor="black", elinewidth=0.5, capsize=1)
        ax.axhline(1.0, color="grey", linewidth=0.8)
        ax.set_xticks(range(len(categories)), [label_for(exp.spec, KEY, c) for c in categories], rotation=30,
                      ha="right", fontsize=7)
        ax.set_title(title + (" — 95% intervals; hatched: unlike (too little identical work)" if title == "ours"
                              else ""), fontsize=8)
        ax.set_ylabel("speed-up over greedy (×)")
        ax.grid(axis="y", alpha=0.3)
        ax.set_ylim(0, top * 1.5)  # room above the bars for the legend
        if methods:  # plain patches: a method's first bar may be hatched (unlike), its legend entry is not
            ax.legend(handles=[Patch(color=colour[m], label=label_for(exp.spec, "method.name", m)) for m in methods],
                      fontsize=6, ncol=3, loc="upper center")
    fig.suptitle(exp.spec.get("title", exp.name), fontsize=8)
    return save(fig, out_dir, "speedup_by_category")


@dataclass
class Bar:
    value: float
    interval: tuple | None = None
    flagged: bool = False

    @property
    def high(self) -> float:
        return self.interval[1] if self.interval else self.value


def bars(entries: list[Entry]) -> dict[tuple, Bar]:
    """(category, method) -> speed-up (with its interval and unlike flag), of the entries that have a number."""
    return {(e.keys.get(KEY), e.keys.get("method.name")): Bar(e.values["speedup"], e.intervals.get("speedup"),
                                                              "speedup" in e.flagged)
            for e in entries if e.status == "ok" and isinstance(e.values.get("speedup"), (int, float))}


ACCEPT_SHOWN = 8  # accept lengths drawn: 1..8 tokens a step (longer steps pooled into the last)


def acceptance_by_category(exp: Experiment, out_dir: Path) -> list[Path]:
    """Per category (and overall), one panel each: above, per-position acceptance α_k against k per method
    (metrics.acceptance_by_position); below, the distribution of tokens emitted per step (accept length, the bonus
    or correction token included; steps of 8 or more pooled at 8), each method's fraction of steps. From the cells'
    records split by category; greedy (nothing proposed) left out."""
    from matplotlib import colormaps
    from matplotlib.figure import Figure

    cells = [c for c in exp.cells if c.status == "ok" and c.baseline.key != c.spec.key]
    if not cells:
        return []
    categories = [c for c in CATEGORIES if any((r.category or UNCATEGORISED) == c for cell in cells
                                               for r in cell.records)] + [OVERALL]
    methods = list(dict.fromkeys(c.value("method.name") for c in cells))
    colour = {m: colormaps["tab20"](i % 20) for i, m in enumerate(methods)}
    fig = Figure(figsize=(2.3 * len(categories) + 0.8, 5.2))
    axes = fig.subplots(2, len(categories), squeeze=False, sharey="row")
    for col, category in enumerate(categories):
        top, bottom = axes[0][col], axes[1][col]
        for cell in cells:
            method = cell.value("method.name")
            records = [r for r in cell.records if category == OVERALL or (r.category or UNCATEGORISED) == category]
            alpha = [(k, a) for k, a in enumerate(acceptance_by_position(records), start=1) if a is not None]
            if alpha:
                top.plot([k for k, _ in alpha], [a for _, a in alpha], marker="o", ms=2, lw=0.8, color=colour[method],
                         label=label_for(exp.spec, "method.name", method))
            steps = [min(n, ACCEPT_SHOWN) for r in records for n in r.accept_lengths or []]
            if steps:
                counts = [steps.count(n) / len(steps) for n in range(1, ACCEPT_SHOWN + 1)]
                bottom.plot(range(1, ACCEPT_SHOWN + 1), counts, marker=".", ms=3, lw=0.8, color=colour[method])
        top.set_title(label_for(exp.spec, KEY, category), fontsize=7)
        top.set_ylim(0, 1.05)
        bottom.set_xlabel("tokens per step", fontsize=7)
        bottom.set_xticks(range(1, ACCEPT_SHOWN + 1), [*map(str, range(1, ACCEPT_SHOWN)), f"{ACCEPT_SHOWN}+"],
                          fontsize=6)
        top.set_xlabel("k", fontsize=7)
        for ax in (top, bottom):
            ax.tick_params(labelsize=6)
            ax.grid(alpha=0.3)
    axes[0][0].set_ylabel("α_k (accepted | k−1 accepted)", fontsize=7)
    axes[1][0].set_ylabel("fraction of steps", fontsize=7)
    handles, labels = axes[0][-1].get_legend_handles_labels()
    if handles:
        fig.legend(handles, labels, fontsize=6, ncol=min(len(labels), 6), loc="lower center")
    fig.suptitle(f"{exp.spec.get('title', exp.name)}: per-position acceptance and accept lengths", fontsize=8)
    fig.subplots_adjust(bottom=0.2, wspace=0.15, hspace=0.45)
    return save(fig, out_dir, "acceptance_by_category")
