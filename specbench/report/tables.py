"""A paper table from entries: ours (one per sweep cell) beside the paper's published numbers.

An ``Entry`` is one cell's numbers for one source (ours or the paper), named by its key values (e.g.
``data.name=gsm8k, method.name=ouroboros, model.name=yi-34b-6b``). Rows are the experiment's row keys,
column groups its column keys (the pair, or temperature x dataset); within a group come our metrics, then
the paper's. Nothing is invented: a missing cell prints why it is missing.
"""
from __future__ import annotations

import csv
import io
import math
from dataclasses import dataclass, field


@dataclass(frozen=True)
class Metric:
    header: str
    spec: str = ".2f"
    higher_is_better: bool = True
    suffix: str = ""


METRICS = {
    "tok_per_s": Metric("tok/s"),
    "speedup": Metric("speed-up", suffix="×"),
    "ms_per_token": Metric("latency (ms/token)", higher_is_better=False),
    "tau": Metric("τ"),
    "tau_decoding": Metric("τ, decoding steps"),  # each turn's prompt-reading step left out (metrics.tau_decoding)
    "tau_whole": Metric("τ, whole outputs"),       # over every step of both outputs, whether alike or not
    "tau_prompt_mean": Metric("τ, per-prompt mean"),
    "speedup_whole": Metric("speed-up, whole outputs", suffix="×"),  # every token, alike or not (T = 0)
    "identical_work": Metric("identical work"),    # tokens compared over identical work (analysis/identical_work.py)
    "acceptance_rate": Metric("acceptance", spec=".1%"),
    "accuracy": Metric("accuracy", spec=".1f"),
    "mean_sl": Metric("mean SL"),
    "identical": Metric("identical to greedy"),
    "near_ties": Metric("near-ties", spec="d", higher_is_better=False),
    "mismatches": Metric("mismatches", spec="d", higher_is_better=False),
    "alpha": Metric("α_k"),
    "baseline_tok_per_s": Metric("greedy tok/s"),
    "bound": Metric("bound", suffix="×"),          # the speed-up the forward costs allow (costs.run_bound)
    "efficiency": Metric("efficiency"),            # speed-up / bound, both Σ/Σ over the run's prompts
    "verify_ratio": Metric("T(k)/T(1)"),           # the largest verify block's cost over one token's
    "forward_efficiency": Metric("of which forwards"),  # efficiency = forwards x host work (costs.forward_split)
    "host_efficiency": Metric("of which host work"),
    "latency_speedup": Metric("latency speed-up", suffix="×"),        # per request, paired (= speedup)
    "baseline_batch_tok_per_s": Metric("greedy throughput (tok/s)"),   # engine=vllm: whole batches
    "batch_tok_per_s": Metric("throughput (tok/s)"),
    "throughput_speedup": Metric("throughput speed-up", suffix="×"),
    # served runs (engine=llama_server, vllm_server; analysis/latency.serving_metrics)
    "served_tok_per_s": Metric("throughput (tok/s)"),
    "baseline_served_tok_per_s": Metric("greedy throughput (tok/s)"),
    "throughput_ratio": Metric("throughput ×", suffix="×"),
    "user_speedup": Metric("per-user speed-up", suffix="×"),
    "user_tok_per_s": Metric("per-user tok/s"),
    "baseline_user_tok_per_s": Metric("greedy per-user tok/s"),
    "goodput": Metric("goodput (req/s)"),
    "baseline_goodput": Metric("greedy goodput (req/s)"),
    **{f"{name}_{q}_ms": Metric(f"{name.upper()} {q} (ms)", spec=".0f", higher_is_better=False)
       for name in ("ttft", "tpot", "itl", "e2e") for q in ("p50", "p99")},
    "baseline_ttft_p50_ms": Metric("greedy TTFT p50 (ms)", spec=".0f", higher_is_better=False),
    "baseline_tpot_p50_ms": Metric("greedy TPOT p50 (ms)", spec=".0f", higher_is_better=False),
    "server_acceptance": Metric("server acceptance", spec=".1%"),   # the server's own drafted / accepted counts
    "server_accept_length": Metric("server acceptance length", spec=".2f"),
    "lcp": Metric("len(LCP)", spec=".1f"),
    "match_1_draft": Metric("#Match-1(d, d̂)", spec=".1f"),
    **{f"match_{k}": Metric(f"#Match-{k} discarded", spec=".1f") for k in (1, 2, 3, 4)},
    "oracle_sl": Metric("oracle SL", spec=".1f"),
    "f1_static_sl": Metric("F1 static SL", spec=".0f"),
    "f1_disco": Metric("F1 DISCO", spec=".0f"),
}


@dataclass
class Entry:
    keys: dict                       # key path -> canonical value
    values: dict = field(default_factory=dict)   # metric -> number (or text for `identical`)
    stds: dict = field(default_factory=dict)     # metric -> std over repeats
    intervals: dict = field(default_factory=dict)  # metric -> (low, high), a 95% interval (paired speed-up)
    status: str = "ok"               # ok | not run yet | failed: ... (ours only)
    flagged: set = field(default_factory=set)  # metrics over too little identical work (identical_work.py): unlike
    exact: set = field(default_factory=set)  # metrics known without uncertainty (the baseline's own speed-up, 1)
    paper_note: str | None = None  # ours, not the paper's run: what the paper column says instead (presets.py)


@dataclass
class Table:
    title: str
    header: list[str]                # flat column titles
    groups: list[tuple[str, int]]    # (group title, span) over the metric columns, for LaTeX
    rows: list[list[str]]            # cell texts, with **bold** / <u>underline</u> / ≈ tied / ‡ unlike marks
    notes: list[str]
    tidy: list[dict]                 # one dict per number, for the CSV


def number_text(value, std, metric: Metric, interval=None) -> str:
    if isinstance(value, str):
        return value
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return "–"
    text = format(value, metric.spec) + metric.suffix
    if std:  # std over repeats (only when there are several)
        text += " ± " + format(std, metric.spec)
    if interval:  # a 95% interval (paired speed-up)
        text += f" [{format(interval[0], metric.spec)}, {format(interval[1], metric.spec)}]"
    return text


def ordered(values) -> list:
    seen = []
    for v in values:
        if v not in seen:
            seen.append(v)
    return seen


def row_keys_of(spec) -> list[str]:
    return [r["key"] for r in spec.rows]


def column_keys_of(spec) -> list[str]:
    return [c["key"] for c in spec.get("columns") or []]


def label_for(spec, key: str, value) -> str:
    """How an identifier prints (experiment.labels), e.g. ouroboros_warm -> Ouroboros†; itself otherwise."""
    labels = dict((spec.get("labels") or {}).get(key) or {})  # plain: a config node rejects None as a key
    if value not in labels and str(value) not in labels and isinstance(value, str) and " [" in value:
        base, changed = value.split(" [", 1)  # a paper's method with other settings (presets.py): "name [k=v]"
        return f"{label_for(spec, key, base)} [{changed}"
    return str(labels.get(value, labels.get(str(value), value)))


def build_table(spec, ours: list[Entry], paper: list[Entry], known_methods: set[str]) -> Table:
    """spec: the experiment block (rows, columns, metrics, highlight, labels, title)."""
    row_keys, col_keys = row_keys_of(spec), column_keys_of(spec)

    def label(key, value):
        return label_for(spec, key, value)

    def rkey(e):
        return tuple(e.keys.get(k) for k in row_keys)

    def ckey(e):
        return tuple(e.keys.get(k) for k in col_keys)

    appearance = ordered(rkey(e) for e in ours + paper)  # sweep order first, then the paper's extra rows
    fixed = spec.get("row_order") or {}  # {row key: its values in the order to print them}, else appearance order
    level_order = [ordered([*(fixed.get(k) or []), *(r[i] for r in appearance)]) for i, k in enumerate(row_keys)]
    rows = sorted(appearance, key=lambda r: [level_order[i].index(v) for i, v in enumerate(r)])
    groups = ordered([ckey(e) for e in ours] + [ckey(e) for e in paper])
    our_metrics = list(spec.metrics)
    paper_metrics = ordered([m for m in our_metrics if any(m in e.values for e in paper)]
                            + [m for e in paper for m in e.values])
    by_cell = {("ours", rkey(e), ckey(e)): e for e in ours}
    by_cell.update({("paper", rkey(e), ckey(e)): e for e in paper})

    columns = []  # (source, group, metric)
    group_titles = []
    for g in groups:
        span = 0
        for source, metrics in (("ours", our_metrics), ("paper", paper_metrics)):
            if any((source, r, g) in by_cell for r in rows):
                columns += [(source, g, m) for m in metrics]
                span += len(metrics)
        title = ", ".join(label(k, v) for k, v in zip(col_keys, g))
        group_titles.append((title, span))

    marks = highlight(spec, rows, row_keys, columns, by_cell)
    body, tidy = [], []
    for r in rows:
        line = [label(k, v) for k, v in zip(row_keys, r)]
        for source, g, m in columns:
            e = by_cell.get((source, r, g))
            first = m == (our_metrics if source == "ours" else paper_metrics)[0]
            line.append(cell_text(e, source, m, r, row_keys, known_methods, marks.get((source, r, g, m)), first))
            where = {**dict(zip(row_keys, r)), **dict(zip(col_keys, g)), "source": source, "metric": m}
            if e is not None and e.status == "ok" and m in e.values:
                low, high = e.intervals.get(m) or (None, None)
                tidy.append({**where, "value": e.values.get(m), "std": e.stds.get(m), "ci95_low": low,
                             "ci95_high": high, "unlike": m in e.flagged, "mark": marks.get((source, r, g, m))})
            elif e is not None:  # ours not run / failed; the paper's "different settings" (presets.py)
                tidy.append({**where, "value": None, "std": None, "status": e.status})
        body.append(line)
    header = [r.get("title", r["key"]) for r in spec.rows]
    for source, g, m in columns:
        group = ", ".join(label(k, v) for k, v in zip(col_keys, g))
        header.append(" ".join(x for x in (group, f"({source})", METRICS.get(m, Metric(m)).header) if x))
    return Table(title=spec.get("title", ""), header=header, groups=group_titles, rows=body, notes=[], tidy=tidy)


def cell_text(e: Entry | None, source: str, metric: str, row, row_keys, known_methods, mark, first=True) -> str:
    """A number, or why there is none (said once per cell, in its first metric column)."""
    if not first and (e is None or e.status != "ok"):
        return ""
    if e is None:
        if source == "paper":
            return "not reported"
        method = dict(zip(row_keys, row)).get("method.name")
        if method is not None and method not in known_methods:
            return "not implemented"
        return "not in this sweep"
    if e.status != "ok":
        return e.status
    if metric not in e.values or e.values[metric] is None:
        return "–"
    text = number_text(e.values[metric], e.stds.get(metric), METRICS.get(metric, Metric(metric)),
                       e.intervals.get(metric))
    if metric in e.flagged:
        text += " " + UNLIKE
    return {"best": f"**{text}**", "second": f"<u>{text}</u>", "tied": f"{text} {TIED}"}.get(mark, text)


TIED = "≈"    # tied within noise with the best of its group: their 95% intervals overlap
UNLIKE = "‡"  # over too little identical work to rank (analysis/identical_work.py): never bold


def better(a: tuple[float, float], b: tuple[float, float], higher: bool) -> bool:
    """Interval ``a`` lies wholly on the better side of interval ``b`` (they do not overlap)."""
    return a[0] > b[1] if higher else a[1] < b[0]


def rank_marks(scored: list[tuple[float, object, Entry]], metric: str, higher: bool) -> dict:
    """best / second / tied marks for one group, ``scored`` sorted best first: a mark is earned only by a cell not
    flagged unlike whose 95% interval lies wholly beyond those below it (the best: beyond every other cell; the
    second: the best earned its mark and the second lies beyond every cell below it). When the best's interval
    overlaps another's, the best and every cell overlapping it are "tied" (tied within noise), none bold. A group
    where some value has no interval gets no marks: no ordering is claimed that no interval supports."""
    interval = {id(e): (v, v) if metric in e.exact else e.intervals.get(metric) for v, _, e in scored}
    if len(scored) < 2 or any(i is None for i in interval.values()):
        return {}
    eligible = [x for x in scored if metric not in x[2].flagged]
    if not eligible:
        return {}
    best = eligible[0]
    mine = interval[id(best[2])]
    others = [x for x in scored if x is not best]
    if any(better(interval[id(x[2])], mine, higher) for x in others):  # a cell flagged unlike lies clearly above
        return {}
    overlapping = [x for x in others if not better(mine, interval[id(x[2])], higher)]
    if overlapping:  # a cell flagged unlike keeps the best from its mark, and earns no mark itself
        return {x[1]: "tied" for x in [best, *overlapping] if metric not in x[2].flagged}
    marks = {best[1]: "best"}
    rest = [x for x in eligible if x is not best]
    if rest:
        second = rest[0]
        below = scored[scored.index(second) + 1:]
        if below and all(better(interval[id(second[2])], interval[id(x[2])], higher) for x in below):
            marks[second[1]] = "second"
    return marks


def highlight(spec, rows, row_keys, columns, by_cell) -> dict:
    """Bold the best and underline the second best of each highlighted metric among rows sharing the
    ``highlight.within`` row keys (the papers' convention), per column and source — only where the 95% intervals
    separate them (``rank_marks``): otherwise the best and those tied with it are marked tied within noise. The
    paper's columns publish no intervals: they are not ranked."""
    h = spec.get("highlight")
    if not h:
        return {}
    within = list(h.get("within") or [])
    marks = {}
    for source, g, m in columns:
        if m not in h.metrics:
            continue
        higher = METRICS.get(m, Metric(m)).higher_is_better
        parts = {}
        for r in rows:
            e = by_cell.get((source, r, g))
            if e is not None and e.status == "ok" and isinstance(e.values.get(m), (int, float)):
                part = tuple(v for k, v in zip(row_keys, r) if k in within)
                parts.setdefault(part, []).append((e.values[m], r, e))
        for scored in parts.values():
            scored.sort(key=lambda x: -x[0] if higher else x[0])
            marks.update({(source, r, g, m): mark for r, mark in rank_marks(scored, m, higher).items()})
    return marks


def to_markdown(table: Table) -> str:
    def row(cells):
        return "| " + " | ".join(str(c).replace("|", "\\|") for c in cells) + " |"
    lines = [f"### {table.title}", ""] if table.title else []
    lines += [row(table.header), row(["---"] * len(table.header)), *[row(r) for r in table.rows]]
    if table.notes:
        lines += [""] + [f"- {n}" for n in table.notes]
    return "\n".join(lines) + "\n"


def latex_escape(text: str) -> str:
    out = str(text)
    for a, b in (("\\", r"\textbackslash{}"), ("&", r"\&"), ("%", r"\%"), ("_", r"\_"), ("#", r"\#"),
                 ("±", r"$\pm$"), ("×", r"$\times$"), ("τ", r"$\tau$"), ("α", r"$\alpha$"), ("†", r"$^\dagger$"),
                 ("‡", r"$^\ddagger$"), ("≈", r"$\approx$"), ("–", "--")):
        out = out.replace(a, b)
    return out


def latex_cell(text: str) -> str:
    if text.startswith("**") and text.endswith("**"):
        return r"\textbf{" + latex_escape(text[2:-2]) + "}"
    if text.startswith("<u>") and text.endswith("</u>"):
        return r"\underline{" + latex_escape(text[3:-4]) + "}"
    return latex_escape(text)


def to_latex(table: Table) -> str:
    n_keys = len(table.header) - sum(span for _, span in table.groups)
    lines = [r"\begin{table}[t]", r"\centering", r"\small",
             r"\begin{tabular}{" + "l" * n_keys + "r" * (len(table.header) - n_keys) + "}", r"\toprule"]
    if any(title for title, _ in table.groups):
        top = [""] * n_keys + [rf"\multicolumn{{{span}}}{{c}}{{{latex_escape(title)}}}"
                               for title, span in table.groups if span]
        lines.append(" & ".join(top) + r" \\")
    lines.append(" & ".join(latex_escape(h) for h in table.header) + r" \\")
    lines.append(r"\midrule")
    lines += [" & ".join(latex_cell(c) for c in r) + r" \\" for r in table.rows]
    lines += [r"\bottomrule", r"\end{tabular}"]
    # the notes say what the columns are (metric definitions, marks, ‡, sources, machine): a table without them
    # would sit beside the paper's numbers unexplained
    lines += [r"\par\smallskip{\footnotesize " + latex_escape(note) + "}" for note in table.notes]
    lines += [rf"\caption{{{latex_escape(table.title)}}}", r"\end{table}"]
    return "\n".join(lines) + "\n"


def to_csv(table: Table) -> str:
    fields = ordered(k for row in table.tidy for k in row)
    buf = io.StringIO()
    writer = csv.DictWriter(buf, fieldnames=fields, lineterminator="\n")
    writer.writeheader()
    writer.writerows(table.tidy)
    return buf.getvalue()
