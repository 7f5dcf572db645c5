"""The papers' figures from our records (matplotlib, PNG + PDF). Each returns the files it wrote, or []
when the experiment has no data for it yet.

speed_bars     Ouroboros Fig. 4: tok/s per method and task; the warm-start gain shaded on the Ouroboros bar
topk_curve     Ouroboros Fig. 5: tok/s against K (candidate suffixes verified per step)
match_k_bars   Ouroboros Fig. 3: mean #Match-k of discarded draft tokens per rejected step, and len(LCP)
oracle_sl_hist DISCO Fig. 4: distribution of the oracle speculation length
tau_speedup    τ (tokens per target forward) against measured speed-up, one point per cell
metric_bars    each numeric metric per row, ours beside the paper's (DISCO Table 5's F1)
alpha_curve    per-position acceptance α_k against k, one line per cell (records with ``proposed`` only)
speedup_vs_batch  throughput speed-up against runner.batch_size (engine=vllm), 95% interval bars, a line per method
speedup_by_category  Spec-Bench: speed-up per category and overall per method, ours and the leaderboard's
acceptance_by_category  Spec-Bench: α_k and the distribution of tokens per step, per category and method
speedup_vs_load, pareto, latency_vs_load  serving sweeps (report/serving.py)
"""
from __future__ import annotations

import re
from collections import defaultdict
from pathlib import Path

from matplotlib.figure import Figure  # no pyplot: no global backend state, safe in notebooks and workers

from ..training.disco.tables import oracle_statistics
from ..analysis.metrics import acceptance_by_position
from .figure_files import save
from .paper import canonical, match_stats
from .serving import FIGURES as SERVING_FIGURES
from .spec_bench import acceptance_by_category, speedup_by_category
from .tables import METRICS, Metric, column_keys_of, label_for, row_keys_of

WARM_SUFFIX = "_warm"


def label_of(exp, key, value) -> str:
    return label_for(exp.spec, key, canonical(exp.spec, key, value))


def ok_cells(exp):
    return [c for c in exp.cells if c.status == "ok"]


def decorate(ax, exp, xlabel: str, ylabel: str, grid: str = "both") -> None:
    ax.set_xlabel(xlabel)
    ax.set_ylabel(ylabel)
    ax.grid(axis=grid, alpha=0.3)
    ax.legend(fontsize=7)
    ax.set_title(exp.spec.get("title", exp.name), fontsize=8)


def speed_panels(exp) -> dict[str, dict[tuple, float]]:
    """tok/s per (task, method), one panel per pair: ours from the cells, then the paper's published ones."""
    panels: dict[str, dict[tuple, float]] = {}
    for c in ok_cells(exp):
        if c.summary.get("tok_per_s"):
            task = canonical(exp.spec, "data.name", c.value("data.name"))
            panels.setdefault(f"{c.spec.pair} (ours)", {})[(task, c.spec.method)] = c.summary["tok_per_s"]
    if panels:  # the paper beside ours, only once we have something to compare
        for e in exp.published:
            if "tok_per_s" in e.values and e.keys.get("model.name") and e.keys.get("method.name"):
                pair = label_of(exp, "model.name", e.keys["model.name"])
                key = (e.keys.get("data.name"), e.keys["method.name"])
                panels.setdefault(f"{pair} (paper)", {})[key] = e.values["tok_per_s"]
    return panels


def speed_bars(exp, out_dir: Path) -> list[Path]:
    panels = speed_panels(exp)
    if not panels:
        return []
    fig = Figure(figsize=(4.2 * len(panels) + 1.8, 3.6))
    axes = fig.subplots(1, len(panels), squeeze=False)
    handles = {}
    for ax, (title, speed) in zip(axes[0], panels.items()):
        tasks = list(dict.fromkeys(task for task, _ in speed))
        methods = [m for m in dict.fromkeys(m for _, m in speed) if not m.endswith(WARM_SUFFIX)]
        width = 0.8 / max(len(methods), 1)
        for j, method in enumerate(methods):
            xs = [i + (j - (len(methods) - 1) / 2) * width for i in range(len(tasks))]
            cold = [speed.get((t, method), 0.0) for t in tasks]
            bars = ax.bar(xs, cold, width, color=f"C{j}")
            handles[label_of(exp, "method.name", method)] = bars
            warm = [speed.get((t, method + WARM_SUFFIX)) for t in tasks]
            gain = [max(w - c, 0.0) if w is not None else 0.0 for w, c in zip(warm, cold)]
            if any(gain):  # the paper's Fig. 4: the warm-start gain shaded on top of the cold bar
                handles[label_of(exp, "method.name", method + WARM_SUFFIX) + ": warm-start gain"] = ax.bar(
                    xs, gain, width, bottom=cold, color=f"C{j}", alpha=0.45, hatch="//", edgecolor="black",
                    linewidth=0.4)
            slower = [(x, w) for x, w, c in zip(xs, warm, cold) if w is not None and w < c]
            if slower:  # warm start measured slower: a marker at the warm speed instead
                handles[label_of(exp, "method.name", method + WARM_SUFFIX) + ": slower than cold"] = ax.scatter(
                    [x for x, _ in slower], [w for _, w in slower], marker="_", s=300, color="black", zorder=3)
        ax.set_xticks(range(len(tasks)), [label_of(exp, "data.name", t) for t in tasks])
        ax.set_ylabel("decoding speed (tok/s)")
        ax.set_title(title, fontsize=9)
        ax.grid(axis="y", alpha=0.3)
    fig.legend(list(handles.values()), list(handles), fontsize=7, loc="center left", bbox_to_anchor=(1.0, 0.5))
    fig.suptitle(exp.spec.get("title", exp.name), fontsize=9)
    return save(fig, out_dir, "speed_bars")


def topk_curve(exp, out_dir: Path) -> list[Path]:
    cells = [c for c in ok_cells(exp) if c.value("method.top_k") is not None and c.summary.get("tok_per_s")]
    if not cells:
        return []
    fig = Figure(figsize=(4.8, 3.4))
    ax = fig.subplots()
    lines = defaultdict(list)
    for c in cells:
        lines[(c.spec.pair, label_of(exp, "data.name", c.value("data.name")))].append(
            (c.value("method.top_k"), c.summary["tok_per_s"]))
    for (pair, task), points in lines.items():
        points.sort()
        ax.plot([k for k, _ in points], [v for _, v in points], marker="o", label=f"{task} ({pair})")
    decorate(ax, exp, "K (candidate suffixes per step)", "decoding speed (tok/s)")
    return save(fig, out_dir, "topk_curve")


def match_k_bars(exp, out_dir: Path) -> list[Path]:
    stats = {}
    for c in ok_cells(exp):
        s = match_stats(c.records)
        if s:
            stats[(c.spec.pair, label_of(exp, "data.name", c.value("data.name")))] = s
    if not stats:
        return []
    keys = ["lcp"] + sorted(k for k in {k for s in stats.values() for k in s} if re.fullmatch(r"match_\d+", k))
    fig = Figure(figsize=(5.2, 3.4))
    ax = fig.subplots()
    width = 0.8 / len(stats)
    for j, ((pair, task), s) in enumerate(stats.items()):
        xs = [i + (j - (len(stats) - 1) / 2) * width for i in range(len(keys))]
        ax.bar(xs, [s.get(k, 0.0) for k in keys], width, label=f"{task} ({pair})")
    ax.set_xticks(range(len(keys)),
                  ["len(LCP)" if k == "lcp" else f"#Match-{k.split('_')[1]}\n(discarded)" for k in keys])
    decorate(ax, exp, "", "tokens per rejected step (mean)", grid="y")
    return save(fig, out_dir, "match_k_bars")


def oracle_sl_hist(exp, out_dir: Path) -> list[Path]:
    series = dict(exp.extras.get("oracle_sl") or {})
    for c in ok_cells(exp):
        if c.spec.method == "oracle_sl":  # the oracle SL as DISCO's pipeline counts it: accepted per step
            sls = [n for seq in oracle_statistics(c.records)["per_prompt"].values() for n in seq]
            if sls:
                series[f"{label_of(exp, 'data.name', c.value('data.name'))} ({c.spec.pair})"] = sls
    if not series:
        return []
    fig = Figure(figsize=(4.8, 3.4))
    ax = fig.subplots()
    top = max(max(v) for v in series.values())
    bins = range(0, top + 2)
    for name, values in series.items():
        ax.hist(values, bins=bins, density=True, alpha=0.55, label=f"{name}: mean {sum(values) / len(values):.1f}")
    decorate(ax, exp, "oracle speculation length (tokens accepted per step)", "probability", grid="y")
    return save(fig, out_dir, "oracle_sl_hist")


def tau_speedup(exp, out_dir: Path) -> list[Path]:
    """From the table's own entries (sweep cells or pipeline rows): coloured by the column group (pair,
    temperature x task) and the first row key when there are several, each point named by the other row keys."""
    points = [e for e in exp.entries if e.status == "ok" and isinstance(e.values.get("tau"), float)
              and isinstance(e.values.get("speedup"), float)]
    if not points:
        return []
    row_keys, col_keys = row_keys_of(exp.spec), column_keys_of(exp.spec)
    colour_keys, name_keys = (row_keys[:1], row_keys[1:]) if len(row_keys) > 1 else ([], row_keys)
    fig = Figure(figsize=(4.8, 3.6))
    ax = fig.subplots()
    groups = {}
    for e in points:
        group = ", ".join(label_of(exp, k, e.keys.get(k)) for k in colour_keys + col_keys) or exp.name
        groups.setdefault(group, []).append(e)
    for group, mine in groups.items():
        dots = ax.scatter([e.values["tau"] for e in mine], [e.values["speedup"] for e in mine], label=group)
        unlike = [e for e in mine if "speedup" in e.flagged]  # over too little identical work: drawn hollow
        if unlike:
            ax.scatter([e.values["tau"] for e in unlike], [e.values["speedup"] for e in unlike], s=60,
                       facecolors="none", edgecolors=dots.get_facecolor()[:1], linewidths=0.8)
        for e in mine:
            name = " / ".join(label_of(exp, k, e.keys.get(k)) or "–" for k in name_keys)
            ax.annotate(name, (e.values["tau"], e.values["speedup"]), fontsize=6, xytext=(3, 3),
                        textcoords="offset points")
    ax.axhline(1.0, color="grey", lw=0.8, ls="--")
    decorate(ax, exp, "τ (tokens per target forward)", "speed-up vs greedy")
    return save(fig, out_dir, "tau_speedup")


def metric_bars(exp, out_dir: Path) -> list[Path]:
    """Each numeric metric of the table, one bar per row and source (ours, the paper's): e.g. DISCO Table 5's F1."""
    ours = [e for e in exp.entries if e.status == "ok"]
    metrics = [m for m in exp.spec.metrics if any(isinstance(e.values.get(m), (int, float)) for e in ours)]
    if not metrics:
        return []
    row_keys = row_keys_of(exp.spec)
    fig = Figure(figsize=(4.2 * len(metrics), 3.4))
    axes = fig.subplots(1, len(metrics), squeeze=False)[0]
    for ax, metric in zip(axes, metrics):
        bars = [(" / ".join(label_of(exp, k, e.keys.get(k)) for k in row_keys), source, e.values[metric])
                for source, entries in (("ours", ours), ("paper", exp.published)) for e in entries
                if isinstance(e.values.get(metric), (int, float))]
        ax.bar(range(len(bars)), [v for _, _, v in bars], color=["C0" if s == "ours" else "C7" for _, s, _ in bars])
        ax.set_xticks(range(len(bars)), [f"{name}\n({source})" for name, source, _ in bars], fontsize=7)
        ax.set_title(METRICS.get(metric, Metric(metric)).header, fontsize=9)
        ax.grid(axis="y", alpha=0.3)
    fig.suptitle(exp.spec.get("title", exp.name), fontsize=9)
    return save(fig, out_dir, "metric_bars")


def alpha_curve(exp, out_dir: Path) -> list[Path]:
    """α_k (metrics.acceptance_by_position) against k from each cell's records, one line per cell named by its row
    keys, one panel per column group (pair, temperature x task); cells whose records have no ``proposed`` (greedy,
    records from before it was recorded) are left out, and positions no step reached are not drawn."""
    panels: dict[str, dict[str, list[tuple[int, float]]]] = {}
    row_keys, col_keys = row_keys_of(exp.spec), column_keys_of(exp.spec)
    for c in ok_cells(exp):
        points = [(k, a) for k, a in enumerate(acceptance_by_position(c.records), start=1) if a is not None]
        if points:
            panel = ", ".join(label_of(exp, k, c.value(k)) for k in col_keys) or exp.name
            name = " / ".join(label_of(exp, k, c.value(k)) for k in row_keys) or c.spec.method
            panels.setdefault(panel, {})[name] = points
    if not panels:
        return []
    fig = Figure(figsize=(4.2 * len(panels) + 0.6, 3.4))
    axes = fig.subplots(1, len(panels), squeeze=False)[0]
    for ax, (title, lines) in zip(axes, panels.items()):
        for name, points in lines.items():
            ax.plot([k for k, _ in points], [a for _, a in points], marker="o", ms=3, label=name)
        ax.set_ylim(0, 1.05)
        ax.xaxis.get_major_locator().set_params(integer=True)
        ax.set_xlabel("k (position in the proposal)")
        ax.set_ylabel("α_k (accepted | k-1 accepted)")
        ax.grid(alpha=0.3)
        ax.legend(fontsize=6)
        ax.set_title(title, fontsize=8)
    fig.suptitle(exp.spec.get("title", exp.name), fontsize=9)
    return save(fig, out_dir, "alpha_curve")


BATCH_KEY = "runner.batch_size"


def speedup_vs_batch(exp, out_dir: Path) -> list[Path]:
    """From the table's entries: the throughput speed-up (whole batches against greedy's batch in the same round,
    metrics.throughput_compare) against the batch size, on a log2 axis, with its 95% interval; one line per value
    of the other keys (the method); the dashed 1.0× line is where speculation stops paying."""
    points = [e for e in exp.entries if e.status == "ok" and isinstance(e.keys.get(BATCH_KEY), int)
              and isinstance(e.values.get("throughput_speedup"), (int, float))]
    if not points:
        return []
    others = [k for k in exp.keys if k != BATCH_KEY]
    lines: dict[str, list] = {}
    for e in points:
        lines.setdefault(" / ".join(label_of(exp, k, e.keys.get(k)) for k in others) or exp.name, []).append(e)
    fig = Figure(figsize=(4.8, 3.4))
    ax = fig.subplots()
    for name, entries in lines.items():
        entries.sort(key=lambda e: e.keys[BATCH_KEY])
        ys = [e.values["throughput_speedup"] for e in entries]
        bounds = [e.intervals.get("throughput_speedup") or (y, y) for e, y in zip(entries, ys)]
        errors = [[max(y - low, 0.0) for y, (low, _) in zip(ys, bounds)],
                  [max(high - y, 0.0) for y, (_, high) in zip(ys, bounds)]]
        ax.errorbar([e.keys[BATCH_KEY] for e in entries], ys, yerr=errors, marker="o", ms=4, capsize=3, label=name)
    ax.axhline(1.0, color="grey", lw=0.8, ls="--", label="1.0×: speculation stops paying")
    ax.set_xscale("log", base=2)
    sizes = sorted({e.keys[BATCH_KEY] for e in points})
    ax.set_xticks(sizes, [str(size) for size in sizes])
    ax.minorticks_off()
    decorate(ax, exp, "batch size (requests in flight)", "throughput speed-up vs greedy")
    return save(fig, out_dir, "speedup_vs_batch")


FIGURES = {**{f.__name__: f for f in (speed_bars, topk_curve, match_k_bars, oracle_sl_hist, tau_speedup, metric_bars,
                                      alpha_curve, speedup_vs_batch, speedup_by_category, acceptance_by_category)},
           **SERVING_FIGURES}
