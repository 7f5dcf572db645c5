"""The papers' figures from our records (matplotlib, PNG + PDF). Each returns the files it wrote, or []
when the experiment has no data for it yet.

speed_bars     Ouroboros Fig. 4: tok/s per method and task; the warm-start gain shaded on the Ouroboros bar
topk_curve     Ouroboros Fig. 5: tok/s against K (candidate suffixes verified per step)
match_k_bars   Ouroboros Fig. 3: mean #Match-k of discarded draft tokens per rejected step, and len(LCP)
oracle_sl_hist DISCO Fig. 4: distribution of the oracle speculation length
tau_speedup    τ (tokens per target forward) against measured speed-up, one point per cell
"""
from __future__ import annotations

from collections import defaultdict
from pathlib import Path

from matplotlib.figure import Figure  # no pyplot: no global backend state, safe in notebooks and workers

from .paper import canonical, match_stats

WARM_SUFFIX = "_warm"


def label_of(exp, key, value) -> str:
    value = canonical(exp.spec, key, value)
    labels = (exp.spec.get("labels") or {}).get(key) or {}
    return str(labels.get(value, value))


def ok_cells(exp):
    return [c for c in exp.cells if c.status == "ok"]


def save(fig, out_dir: Path, name: str) -> list[Path]:
    out_dir.mkdir(parents=True, exist_ok=True)
    paths = [out_dir / f"{name}.png", out_dir / f"{name}.pdf"]
    fig.tight_layout()
    fig.savefig(paths[0], dpi=150, bbox_inches="tight")
    fig.savefig(paths[1], bbox_inches="tight")
    return paths


def decorate(ax, exp, xlabel: str, ylabel: str, grid: str = "both") -> None:
    ax.set_xlabel(xlabel)
    ax.set_ylabel(ylabel)
    ax.grid(axis=grid, alpha=0.3)
    ax.legend(fontsize=7)
    ax.set_title(exp.spec.get("title", exp.name), fontsize=8)


def speed_bars(exp, out_dir: Path) -> list[Path]:
    cells = [c for c in ok_cells(exp) if c.summary.get("tok_per_s")]
    if not cells:
        return []
    pairs = list(dict.fromkeys(c.spec.pair for c in cells))
    fig = Figure(figsize=(5.5 * len(pairs), 3.6))
    axes = fig.subplots(1, len(pairs), squeeze=False)
    for ax, pair in zip(axes[0], pairs):
        mine = [c for c in cells if c.spec.pair == pair]
        tasks = list(dict.fromkeys(c.value("data.name") for c in mine))
        methods = [m for m in dict.fromkeys(c.spec.method for c in mine) if not m.endswith(WARM_SUFFIX)]
        speed = {(c.value("data.name"), c.spec.method): c.summary["tok_per_s"] for c in mine}
        width = 0.8 / max(len(methods), 1)
        for j, method in enumerate(methods):
            xs = [i + (j - (len(methods) - 1) / 2) * width for i in range(len(tasks))]
            cold = [speed.get((t, method), 0.0) for t in tasks]
            bars = ax.bar(xs, cold, width, label=label_of(exp, "method.name", method))
            warm = [speed.get((t, method + WARM_SUFFIX)) for t in tasks]
            if any(w is not None for w in warm):
                gain = [max((w or c) - c, 0.0) for w, c in zip(warm, cold)]
                ax.bar(xs, gain, width, bottom=cold, color=bars.patches[0].get_facecolor(), alpha=0.45, hatch="//",
                       edgecolor="black", linewidth=0.4, label=label_of(exp, "method.name", method + WARM_SUFFIX) + " (warm-start gain)")
                slower = [(x, w) for x, w, c in zip(xs, warm, cold) if w is not None and w < c]
                if slower:  # warm start measured slower: no shading, a marker at the warm speed instead
                    ax.scatter([x for x, _ in slower], [w for _, w in slower], marker="_", s=300, color="black",
                               zorder=3, label="warm start (slower than cold)")
        ax.set_xticks(range(len(tasks)), [label_of(exp, "data.name", t) for t in tasks])
        ax.set_ylabel("decoding speed (tok/s)")
        ax.set_title(pair)
        ax.grid(axis="y", alpha=0.3)
    axes[0][-1].legend(fontsize=7, loc="upper left", bbox_to_anchor=(1.0, 1.0))
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
        lines[(c.spec.pair, label_of(exp, "data.name", c.value("data.name")))].append((c.value("method.top_k"), c.summary["tok_per_s"]))
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
    keys = ["lcp"] + sorted(k for k in {k for s in stats.values() for k in s} if k.startswith("match_"))
    fig = Figure(figsize=(5.2, 3.4))
    ax = fig.subplots()
    width = 0.8 / len(stats)
    for j, ((pair, task), s) in enumerate(stats.items()):
        xs = [i + (j - (len(stats) - 1) / 2) * width for i in range(len(keys))]
        ax.bar(xs, [s.get(k, 0.0) for k in keys], width, label=f"{task} ({pair})")
    ax.set_xticks(range(len(keys)), ["len(LCP)" if k == "lcp" else f"#Match-{k.split('_')[1]}" for k in keys])
    decorate(ax, exp, "", "tokens per rejected step (mean)", grid="y")
    return save(fig, out_dir, "match_k_bars")


def oracle_sl_hist(exp, out_dir: Path) -> list[Path]:
    series = dict(exp.extras.get("oracle_sl") or {})
    for c in ok_cells(exp):
        sls = [n for r in c.records for n in ((r.get("extra") or {}).get("sl") or [])]
        if c.spec.method == "oracle_sl" and sls:
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
    cells = [c for c in ok_cells(exp) if isinstance(c.summary.get("tau"), float) and isinstance(c.summary.get("speedup"), float)]
    if not cells:
        return []
    fig = Figure(figsize=(4.8, 3.6))
    ax = fig.subplots()
    for task in dict.fromkeys(c.value("data.name") for c in cells):
        mine = [c for c in cells if c.value("data.name") == task]
        ax.scatter([c.summary["tau"] for c in mine], [c.summary["speedup"] for c in mine], label=label_of(exp, "data.name", task))
        for c in mine:
            ax.annotate(label_of(exp, "method.name", c.spec.method), (c.summary["tau"], c.summary["speedup"]), fontsize=6,
                        xytext=(3, 3), textcoords="offset points")
    ax.axhline(1.0, color="grey", lw=0.8, ls="--")
    decorate(ax, exp, "τ (tokens per target forward)", "speed-up vs greedy")
    return save(fig, out_dir, "tau_speedup")


FIGURES = {f.__name__: f for f in (speed_bars, topk_curve, match_k_bars, oracle_sl_hist, tau_speedup)}
