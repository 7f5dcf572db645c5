"""Serving sweeps' figures and their crossover (engine=llama_server, vllm_server: a cell per server, method and load
level; a line per server and method).

speedup_vs_load   per-user speed-up (paired, 95% interval) and throughput ratio against the load, a line per
                  method, the crossover (where the per-user speed-up falls to 1) marked with its interval
pareto            throughput against per-user tokens/s, speculation on and off, one point per load level
latency_vs_load   TTFT and TPOT percentiles against the load, speculation on and off

``crossovers(exp)`` is the table under the figures: per method, the load at which speculation stops paying
(analysis/latency.crossover over each level's paired per-request ratios), or that it does not within the levels.
"""
from __future__ import annotations

from pathlib import Path

from matplotlib.figure import Figure

from ..analysis.latency import crossover, paired_ratios, prompt_means
from .figure_files import save

LEVEL_KEY = "engine.load.level"
KIND_KEY = "engine.load.kind"


def served_cells(exp) -> dict[str, list]:
    """The finished served cells with a baseline, by line: the method's name, or ``<engine>/<method>`` where the
    sweep has several servers; each list in ascending load."""
    several = len({str(c.value("engine.name")) for c in exp.cells}) > 1
    lines: dict[str, list] = {}
    for cell in exp.cells:
        if cell.status == "ok" and cell.baseline_records and cell.summary.get("served_tok_per_s") is not None:
            method = str(cell.value("method.name"))
            lines.setdefault(f"{cell.value('engine.name')}/{method}" if several else method, []).append(cell)
    for cells in lines.values():
        cells.sort(key=lambda c: float(c.value(LEVEL_KEY)))
    return lines


def labelled(exp, cell, key: str) -> str:
    value = str(cell.value(key))
    return str(((exp.spec.get("labels") or {}).get(key) or {}).get(value, value))


def line_label(exp, cells: list) -> str:
    """A line as the legend names it: the method's label, after the server's where the sweep has several."""
    several = len({str(c.value("engine.name")) for c in exp.cells}) > 1
    method = labelled(exp, cells[0], "method.name")
    return f"{labelled(exp, cells[0], 'engine.name')}: {method}" if several else method


def baselines(exp) -> dict[str, list[tuple]]:
    """Per server (its label), the server without speculation at each load level: (level, per-user tok/s,
    throughput, TTFT p50, TPOT p50), each the mean over the cells at that level (every method's cell timed its
    own baseline passes, minutes apart: the mean uses them all)."""
    points: dict[str, dict[float, list]] = {}
    for cells in served_cells(exp).values():
        for c in cells:
            values = [c.summary.get(k) for k in ("baseline_user_tok_per_s", "baseline_served_tok_per_s",
                                                 "baseline_ttft_p50_ms", "baseline_tpot_p50_ms")]
            points.setdefault(labelled(exp, c, "engine.name"), {}).setdefault(float(c.value(LEVEL_KEY)),
                                                                              []).append(values)
    out = {}
    for server, levels in points.items():
        out[server] = [(level, *[mean_of([v[k] for v in rows]) for k in range(4)])
                       for level, rows in sorted(levels.items())]
    return out


def mean_of(values: list) -> float | None:
    values = [v for v in values if v is not None]
    return sum(values) / len(values) if values else None


def load_label(exp) -> str:
    kinds = {c.value(KIND_KEY) for c in exp.cells}
    return "arrival rate (requests/s)" if kinds == {"rate"} else "concurrency (requests in flight)"


def load_axis(ax, exp) -> None:
    """A log2 axis of the load levels measured, each labelled as written."""
    levels = sorted({float(c.value(LEVEL_KEY)) for cells in served_cells(exp).values() for c in cells})
    ax.set_xscale("log", base=2)
    ax.set_xticks(levels, [f"{x:g}" for x in levels])
    ax.minorticks_off()
    ax.set_xlabel(load_label(exp))


def crossovers(exp) -> dict[str, dict]:
    """Per method: the load at which the per-user speed-up falls to 1, with its 95% bootstrap interval."""
    out = {}
    for method, cells in served_cells(exp).items():
        levels = [float(c.value(LEVEL_KEY)) for c in cells]
        out[method] = crossover(levels, [prompt_means(paired_ratios(c.records, c.baseline_records)) for c in cells])
    return out


def speedup_vs_load(exp, out_dir: Path) -> list[Path]:
    lines = served_cells(exp)
    if not lines:
        return []
    fig = Figure(figsize=(8.0, 3.6))
    ax = fig.subplots()
    found = crossovers(exp)
    for key, cells in lines.items():
        method = line_label(exp, cells)
        xs = [float(c.value(LEVEL_KEY)) for c in cells]
        ys = [c.summary.get("user_speedup") for c in cells]
        bounds = [c.summary.get("user_speedup_ci95") or (y, y) for c, y in zip(cells, ys)]
        errors = [[max(y - lo, 0.0) for y, (lo, _) in zip(ys, bounds)], [max(hi - y, 0.0) for y, (_, hi) in
                                                                          zip(ys, bounds)]]
        line = ax.errorbar(xs, ys, yerr=errors, marker="o", ms=4, capsize=3, label=f"{method}: per-user")
        ax.plot(xs, [c.summary.get("throughput_ratio") for c in cells], ls=":", marker="s", ms=3,
                color=line[0].get_color(), label=f"{method}: throughput")
        c = found.get(key) or {}
        if c.get("crossover") is not None:
            low, high = c["ci95"]
            ax.axvline(c["crossover"], color=line[0].get_color(), lw=0.8, ls="-.")
            if low is not None:
                ax.axvspan(low, high if high is not None else max(xs), color=line[0].get_color(), alpha=0.08)
    ax.axhline(1.0, color="grey", lw=0.8, ls="--", label="1.0×: speculation stops paying")
    load_axis(ax, exp)
    ax.set_ylabel("speed-up vs the server without speculation")
    ax.legend(fontsize=6, loc="upper left", bbox_to_anchor=(1.01, 1.0))  # beside the axes: lines cross anywhere
    ax.set_title(exp.spec.get("title", exp.name), fontsize=8)
    return save(fig, out_dir, "speedup_vs_load")


def pareto(exp, out_dir: Path) -> list[Path]:
    lines = served_cells(exp)
    if not lines:
        return []
    fig = Figure(figsize=(8.0, 3.6))
    ax = fig.subplots()
    for server, points in baselines(exp).items():
        name = "no speculation" if len(baselines(exp)) == 1 else f"{server}: no speculation"
        ax.plot([p[1] for p in points], [p[2] for p in points], marker="o", color="black", label=name,
                        ls="-" if server == next(iter(baselines(exp))) else "--")
        for level, user, total, *_ in points:
            if user is not None and total is not None:
                ax.annotate(f"{level:g}", (user, total), fontsize=6, xytext=(3, 3), textcoords="offset points")
    for cells in lines.values():
        ax.plot([c.summary.get("user_tok_per_s") for c in cells], [c.summary.get("served_tok_per_s") for c in cells],
                marker="o", label=line_label(exp, cells))
    ax.set_xlabel("per-user tokens/s (interactivity)")
    ax.set_ylabel("throughput (output tokens/s)")
    ax.legend(fontsize=6, loc="upper left", bbox_to_anchor=(1.01, 1.0))  # beside the axes: lines cross anywhere
    ax.set_title(f"{exp.spec.get('title', exp.name)}: points are load levels", fontsize=8)
    return save(fig, out_dir, "pareto")


def latency_vs_load(exp, out_dir: Path) -> list[Path]:
    lines = served_cells(exp)
    if not lines:
        return []
    fig = Figure(figsize=(7.6, 3.2))
    left, right = fig.subplots(1, 2)
    servers = baselines(exp)
    for server, points in servers.items():
        name = "no speculation" if len(servers) == 1 else f"{server}: no speculation"
        style = "-" if server == next(iter(servers)) else "--"
        left.plot([p[0] for p in points], [p[3] for p in points], color="black", marker="o", ls=style,
                  label=f"{name}, p50")
        right.plot([p[0] for p in points], [p[4] for p in points], color="black", marker="o", ls=style,
                   label=f"{name}, p50")
    for cells in lines.values():
        method = line_label(exp, cells)
        xs = [float(c.value(LEVEL_KEY)) for c in cells]
        for ax, name in ((left, "ttft"), (right, "tpot")):
            line, = ax.plot(xs, [c.summary.get(f"{name}_p50_ms") for c in cells], marker="o", label=f"{method}, p50")
            ax.plot(xs, [c.summary.get(f"{name}_p99_ms") for c in cells], ls=":", marker="^",
                    color=line.get_color(), label=f"{method}, p99")
    for ax, what in ((left, "TTFT (ms)"), (right, "TPOT (ms)")):
        load_axis(ax, exp)
        ax.set_ylabel(what)
        ax.legend(fontsize=6)
    return save(fig, out_dir, "latency_vs_load")


FIGURES = {f.__name__: f for f in (speedup_vs_load, pareto, latency_vs_load)}


def write_crossovers(exp, out_dir: Path) -> dict:
    """crossover.json and crossover.md beside the table, for an experiment with served cells; {} otherwise."""
    import json

    found = crossovers(exp)
    if not found:
        return {}
    out_dir.mkdir(parents=True, exist_ok=True)
    lines = [f"Where speculation stops paying ({load_label(exp)}): the load at which the per-user speed-up over the "
             "server without speculation falls to 1.0×, interpolated in log load between levels, with a 95% "
             "bootstrap interval over each level's paired requests.", ""]
    lines_of = served_cells(exp)
    for key, c in found.items():
        method = line_label(exp, lines_of[key])
        low, high = c["ci95"] if c["ci95"] else (None, None)
        levels = ", ".join(f"{x:g}" for x in c["levels"])
        if c["crossover"] is None:
            text = f"none within the levels measured ({levels}); {c['beyond']:.0%} of resamples never cross"
        else:
            interval = f"[{'%.2f' % low if low is not None else '≤ first level'}, " \
                       f"{'%.2f' % high if high is not None else '> ' + levels.split(', ')[-1]}]"
            text = f"{c['crossover']:.2f} {interval} (levels {levels})"
        lines.append(f"- {method}: {text}")
    paths = {"crossover.json": out_dir / "crossover.json", "crossover.md": out_dir / "crossover.md"}
    paths["crossover.json"].write_text(json.dumps(found, indent=2))
    paths["crossover.md"].write_text("\n".join(lines) + "\n")
    return paths
