"""Paper tables from runs/: an experiment's cells -> our entries, the published CSV -> the paper's entries,
rendered side by side to Markdown, LaTeX and CSV (plus the figures the experiment lists)."""
from __future__ import annotations

import csv
from pathlib import Path

from ..environment import cpu_signature
from ..errors import ConfigError, require
from ..records.schema import RunRecord
from ..analysis.console import alpha_text, identity_text
from ..conf_dir import group_options
from .experiment import Cell, Experiment
from .parity import engine_notes, parity
from .presets import NAME
from .tables import TIED, UNLIKE, Entry, Table, build_table, to_csv, to_latex, to_markdown

PUBLISHED_DIR = Path(__file__).resolve().parent / "published"


def known_methods() -> set[str]:
    """The method names a run of ours can have: a conf/method config's, or a head's trained here (conf/head: a run
    with method.head=<name> is named after its head, models/heads/names.py; GRIFFIN's ablation rows), and SAM
    Decoding over any of them (conf/method/sam_speculative.yaml names a run sam_<its fallback's name>)."""
    names = {name for group in ("method", "head") for name in group_options(group)}
    return names | {f"sam_{name}" for name in names}


def canonical(spec, key: str, value):
    """Our identifier -> the paper's (e.g. cnndm_specbench -> cnndm) so both land in one row."""
    mapping = (spec.get("canonical") or {}).get(key) or {}
    return mapping.get(value, value) if isinstance(value, str) else value


def identical_text(cell: Cell) -> str:
    s = cell.summary
    if s.get("is_baseline"):
        return "(baseline)"
    if cell.cfg.sampling.temperature > 0:
        return "n/a (sampling)"
    return identity_text(s) if s.get("compared") else "no baseline"


def match_stats(records: list[RunRecord]) -> dict:
    """Ouroboros Table 1 / Fig. 3, per rejected step (method.match_stats=true): mean len(LCP), #Match-k of the
    discarded draft tokens d_{l_d+2..γ} (Fig. 3), and #Match-1 of the whole draft (Table 1)."""
    lcp = [n for r in records for n in (r.extra.get("lcp") or [])]
    out = {"lcp": sum(lcp) / len(lcp)} if lcp else {}
    for r in records:
        for k, values in (r.extra.get("match_k") or {}).items():
            out.setdefault(f"match_{k}", []).extend(values)
    out = {k: (sum(v) / len(v) if isinstance(v, list) and v else v) for k, v in out.items()
           if not isinstance(v, list) or v}
    if "lcp" in out and "match_1" in out:  # Table 1's #Match-1(d, d̂) over the whole draft: the accepted prefix
        out["match_1_draft"] = out["lcp"] + out["match_1"]  # + matches after the first mismatch (which is 0)
    return out


def cell_entry(spec, cell: Cell, keys: list[str]) -> Entry:
    entry = Entry(keys={k: canonical(spec, k, cell.value(k)) for k in keys}, status=cell.status)
    if cell.unlike is not None and NAME in entry.keys:  # not the paper's run: a row of its own (report/presets.py)
        entry.keys[NAME], entry.paper_note = cell.unlike.row, cell.unlike.note
    if cell.status != "ok":
        return entry
    s = cell.summary
    repeats = s.get("repeats", 1) > 1
    entry.values = {"tok_per_s": s.get("tok_per_s"), "speedup": s.get("speedup"), "ms_per_token": s.get("ms_per_token"),
                    "speedup_whole": s.get("speedup_whole"), "tau_whole": s.get("tau_whole"),
                    "tau_prompt_mean": s.get("tau_prompt_mean"), "identical_work": work_text(s.get("identical_work")),
                    "tau": s.get("tau"), "tau_decoding": s.get("tau_decoding"),
                    "acceptance_rate": s.get("acceptance_rate"),
                    "accuracy": s.get("accuracy_primary"), "mean_sl": s.get("mean_sl"),
                    "identical": identical_text(cell),
                    **match_stats(cell.records)}
    own = s.get("is_baseline")  # greedy's own cell: its numbers are the baseline's
    entry.values.update(
        baseline_tok_per_s=s.get("tok_per_s") if own else s.get("baseline_tok_per_s"),
        latency_speedup=s.get("speedup"), near_ties=s.get("near_ties"), mismatches=s.get("mismatches"),
        alpha=alpha_text(s.get("alpha")) or None,
        # engine=vllm (batches): throughput of whole batches and its paired speed-up (metrics.throughput_compare)
        batch_tok_per_s=s.get("batch_tok_per_s"), throughput_speedup=s.get("throughput_speedup"),
        baseline_batch_tok_per_s=s.get("batch_tok_per_s") if own else s.get("baseline_batch_tok_per_s"),
        **bound_values(s.get("bound")),
        # served runs (engine=llama_server, vllm_server): throughput, latencies (analysis/latency.serving_metrics)
        **{key: s.get(key) for key in SERVING_VALUES})
    if own and s.get("served_tok_per_s") is not None:  # the baseline server's own cell
        entry.values["baseline_served_tok_per_s"] = s["served_tok_per_s"]
    if s.get("speedup") is None and not own:  # paired, but no token both emitted alike with a clock to read there
        entry.values["speedup"] = "no identical work" if s.get("speedup_whole") is not None else "no baseline"
    if repeats:
        entry.stds = {"tok_per_s": s.get("tok_per_s_std"), "speedup": s.get("speedup_std")}
    intervals = {"speedup": s.get("speedup_ci95"), "latency_speedup": s.get("speedup_ci95"),
                 "speedup_whole": s.get("speedup_whole_ci95"), "tau": s.get("tau_ci95"),
                 "throughput_speedup": s.get("throughput_speedup_ci95"), "user_speedup": s.get("user_speedup_ci95")}
    entry.intervals = {k: tuple(v) for k, v in intervals.items() if v}
    if own:  # the baseline against itself: exactly 1 (and τ 1), no interval needed to rank it
        entry.exact = {"speedup", "speedup_whole", "latency_speedup", "tau"}
    if (s.get("identical_work") or {}).get("flagged"):  # over too little identical work: marked, never ranked
        entry.flagged = set(IDENTICAL_WORK_METRICS)
    if "speedup" in entry.intervals:  # a paired speed-up: its interval says more than a std over repeats
        entry.stds.pop("speedup", None)
    return entry


# a served run's numbers, as serving_metrics names them (and the report's METRICS show them)
SERVING_VALUES = ("served_tok_per_s", "baseline_served_tok_per_s", "throughput_ratio", "user_speedup",
                  "user_tok_per_s", "baseline_user_tok_per_s", "goodput", "baseline_goodput", "ttft_p50_ms",
                  "ttft_p99_ms", "tpot_p50_ms", "tpot_p99_ms", "itl_p99_ms", "e2e_p99_ms", "baseline_ttft_p50_ms",
                  "baseline_tpot_p50_ms", "server_acceptance", "server_accept_length")


# the metrics computed over identical work at T = 0 (analysis/identical_work.py), flagged together when a cell is unlike
IDENTICAL_WORK_METRICS = ("speedup", "latency_speedup", "tau", "tau_decoding", "tau_prompt_mean")


def work_text(work: dict | None) -> str | None:
    """'118/128 (5 prompts; 1 unlike)': tokens compared over identical work of the shared prefixes' tokens."""
    if not work:
        return None
    notes = [f"{work['compared']}/{work['prompts']} prompts"]
    if work.get("unlike_prompts"):
        notes.append(f"{work['unlike_prompts']} unlike")
    if work.get("estimated_clock"):
        notes.append(f"{work['estimated_clock']} clock(s) estimated")
    if work.get("missing_clock"):
        notes.append(f"{work['missing_clock']} without a step clock")
    return f"{work['tokens']} tokens ({'; '.join(notes)})"


def bound_values(bound: dict | None) -> dict:
    """The run's bound, efficiency and T(k)/T(1) (its summary file's ``bound``: costs.run_bound), as table values."""
    if not bound:
        return {}
    verify, split = bound.get("verify_ratio") or {}, bound.get("split") or {}
    return {"bound": bound.get("bound"), "efficiency": bound.get("efficiency"),
            "verify_ratio": f"{verify['ratio']:.2f} (k={verify['k']})" if verify else None,
            "forward_efficiency": split.get("forwards"), "host_efficiency": split.get("host")}


def published_entries(spec, keys: list[str]) -> list[Entry]:
    """The paper's numbers: specbench/report/published/<file>.csv, long format (key columns, metric, value).

    ``experiment.published_where`` ({column: value}) keeps the rows of one setting of a file that holds several
    (Spec-Bench's leaderboard: one device and target per setting)."""
    name = spec.get("published")
    if not name:
        return []
    path = PUBLISHED_DIR / name
    if not path.exists():
        available = sorted(p.name for p in PUBLISHED_DIR.glob("*.csv"))
        raise ConfigError(f"experiment.published: no file {path}; available: {available}")
    with open(path) as fh:
        rows = list(csv.DictReader(line for line in fh if not line.startswith("#")))
    where = {k: str(v) for k, v in (spec.get("published_where") or {}).items()}
    for column, value in where.items():
        found = sorted({row.get(column) for row in rows} - {None})
        require(value in found, f"experiment.published_where.{column}", f"{value!r} is not one of {found} ({name})")
    rows = [row for row in rows if all(row.get(k) == v for k, v in where.items())]
    entries: dict[tuple, Entry] = {}
    for row in rows:
        key_values = {k: parse_value(row[k]) for k in keys if k in row}
        e = entries.setdefault(tuple(sorted(key_values.items(), key=str)), Entry(keys=key_values))
        e.values[row["metric"]] = float(row["value"])
    return list(entries.values())


def parse_value(text: str):
    """CSV text -> the type a config value has (true/false, null, ints), so keys compare equal."""
    lowered = text.strip().lower()
    if lowered in ("true", "false"):
        return lowered == "true"
    if lowered in ("null", "none", ""):
        return None
    try:
        return int(text)
    except ValueError:
        try:
            return float(text)
        except ValueError:
            return text


def source_line(spec) -> str | None:
    name = spec.get("published")
    if not name or not (PUBLISHED_DIR / name).exists():
        return None
    first = (PUBLISHED_DIR / name).read_text().splitlines()[0]
    return first.lstrip("# ").strip() if first.startswith("#") else None


def environment_notes(exp: Experiment) -> list[str]:
    notes, seen = [], set()
    for cell in exp.cells:
        if not cell.records:
            continue
        r = cell.records[0]
        env = r.env or {}
        device = env.get("device_name") or env.get("device")
        if env.get("cpu") and str(env.get("device", "cpu")).startswith("cpu"):
            device = cpu_signature(env["cpu"])  # "AMD EPYC" alone names several machines of different speeds
        line = (f"ours: {r.pair} ({r.dtype}) on {device}, "
                f"{env.get('torch_threads')} torch threads, max_new_tokens {r.max_new_tokens}")
        if line not in seen:
            seen.add(line)
            notes.append(line)
    commits = sorted({commit_text((r.env or {}).get("git")) for c in exp.cells for r in c.records[:1]} - {None})
    if commits:
        notes.append("ours: measured at commit " + ", ".join(commits) + "; rendered by `python -m specbench.report "
                     + " ".join([f"experiment={exp.name}", *exp.overrides]) + "`")
    counts = sorted({(c.summary.get("prompts"), c.summary.get("repeats")) for c in exp.cells if c.status == "ok"})
    if counts:
        notes.append("ours: " + "; ".join(f"{p} prompt(s) × {k} repeat(s)" for p, k in counts) + " per cell"
                     + (" (mean ± std over repeats)" if any(k > 1 for _, k in counts) else ""))
    measured = [c for c in exp.cells if c.status == "ok" and c.summary.get("speedup") is not None
                and not c.summary.get("is_baseline")]
    paired = [c for c in measured if c.summary.get("paired")]
    if paired:
        notes.append("ours: speed-up is paired — each prompt's greedy baseline was timed back to back with the "
                     "method, in the same process — the mean of per-prompt ratios with its 95% bootstrap interval")
    if len(paired) < len(measured):
        notes.append("ours: unpaired speed-ups (runner.pairing=separate or runner.baseline=skip): "
                     + ", ".join(c.spec.method + "@" + c.spec.data for c in measured if not c.summary.get("paired")))
    gap = max((baseline_gap_hours(c) for c in exp.cells), default=0.0)
    if gap > 0.5:
        notes.append(f"warning: some speed-ups compare against greedy records measured up to {gap:.1f} h apart "
                     "(resumed from an earlier sweep); machine drift enters them — for like-for-like numbers "
                     "re-measure both in one sweep (a fresh runner.records_dir)")
    overlap = concurrent_cells(exp)
    if overlap:
        notes.append("warning: these runs were measured at the same time on one machine (a parallel launcher), so "
                     "their timings disturb each other: " + ", ".join(overlap))
    return notes


def commit_text(git: dict | None) -> str | None:
    """A record's specbench commit as a report names it: 7 hex digits, '+ local changes' when the tree was dirty."""
    if not git or not git.get("commit"):
        return None
    return str(git["commit"])[:7] + (" + local changes" if git.get("dirty") else "")


def baseline_gap_hours(cell: Cell) -> float:
    """Hours between the middle of a cell's timed records and the middle of its baseline's."""
    if not cell.records or not cell.baseline_records:
        return 0.0
    middle = lambda records: sorted(r.timestamp for r in records)[len(records) // 2]  # noqa: E731
    return abs(middle(cell.records) - middle(cell.baseline_records)) / 3600


def concurrent_cells(exp: Experiment) -> list[str]:
    """Pairs of runs with records timed at the same moment on the same host (a parallel launcher): their speeds
    are not comparable. Each record's own timed interval counts, so runs interleaved with a shared baseline
    (paired rounds, one after another) are not flagged."""
    intervals, seen = [], set()
    for cell in exp.cells:
        for r in cell.records + cell.baseline_records:  # each record once, under its own run's name
            identity = (r.run_key, r.prompt_id, r.repeat, r.round)
            if identity in seen:
                continue
            seen.add(identity)
            host = (r.env or {}).get("hostname")
            intervals.append((r.timestamp - r.wall_s, r.timestamp, host, f"{r.method}@{r.data}"))
    intervals.sort()
    found, active = [], []
    for start, end, host, name in intervals:
        active = [a for a in active if a[1] > start]
        for _, _, other_host, other in active:
            pair = " / ".join(sorted((name, other)))
            if other_host == host and other != name and pair not in found:
                found.append(pair)
        active.append((start, end, host, name))
    return found


def build(exp: Experiment, ours_entries: list[Entry] | None = None) -> Table:
    spec = exp.spec
    ours = ours_entries if ours_entries is not None else [cell_entry(spec, c, exp.keys) for c in exp.cells]
    exp.entries, exp.published = ours, published_entries(spec, exp.keys)
    # where our row is not the paper's run, the paper column says so instead of leaving it empty
    exp.published += [Entry(keys=dict(e.keys), status=e.paper_note) for e in ours if e.paper_note]
    table = build_table(spec, ours, exp.published, known_methods())
    notes = []
    if spec.get("highlight"):
        titles = {r["key"]: r.get("title", r["key"]) for r in spec.rows}
        within = ", ".join(titles.get(k, k) for k in spec.highlight.get("within") or [])
        scope = f" within each {within}" if within else ""
        notes.append(f"**bold** best, <u>underlined</u> second best per column{scope}, only where 95% intervals do not "
                     f"overlap (the best's with every other cell's, the second's with every cell below it); {TIED} "
                     "tied within noise: the best and the cells whose intervals overlap it; a metric without "
                     "intervals, and the paper's columns, are not ranked")
    if any(e.flagged for e in ours):
        notes.append(f"{UNLIKE} unlike: over identical work (the tokens both outputs share) the shared prefix covers "
                     "less than half of the shorter outputs, or the two outputs' lengths differ by more than 1.5x "
                     "(analysis/identical_work.py); such a cell earns no mark")
    if any(isinstance(e.values.get("tau"), (int, float)) and e.values.get("tau_whole") is not None for e in ours):
        notes.append("ours, T = 0: speed-up and τ are over identical work — each prompt compared with greedy over the "
                     "tokens both emitted alike, both clocks read there; τ is pooled over those steps (Σ tokens / Σ "
                     "steps); the whole-output figures (every token, alike or not) are named as such, and the CSV has "
                     "the per-prompt mean τ (tau_prompt_mean)")
    if any(e.paper_note for e in ours):
        notes.append("paper columns say 'different settings' where our row does not run the published configuration "
                     "of the paper's method (experiment.published_presets: conf/method/<preset>.yaml, compared key "
                     "by key): such a row is labelled with what differs and is never set beside the paper's number")
    source = source_line(spec)
    if source:
        notes.append(f"paper columns: {source}")
    notes += [str(n) for n in spec.get("notes") or []]
    notes += environment_notes(exp) + engine_notes(exp)
    parity_notes, parity_rows = parity(exp)
    table.notes = notes + parity_notes
    table.tidy += parity_rows
    return table


def write(table: Table, out_dir: Path, name: str) -> dict[str, Path]:
    out_dir.mkdir(parents=True, exist_ok=True)
    paths = {"md": out_dir / f"{name}.md", "tex": out_dir / f"{name}.tex", "csv": out_dir / f"{name}.csv"}
    paths["md"].write_text(to_markdown(table))
    paths["tex"].write_text(to_latex(table))
    paths["csv"].write_text(to_csv(table))
    return paths
