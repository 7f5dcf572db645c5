"""Paper tables from runs/: table building on hand-made entries, a golden Markdown table from a tiny-model
sweep, figures, parallel launchers, kill-and-resume of a sweep, the W&B report run and the notebook."""
import json
import os
import re
import signal
import subprocess
import sys
from pathlib import Path

import pytest
from omegaconf import OmegaConf

from specbench.errors import ConfigError
from specbench.report.experiment import expand_grid, load_experiment
from specbench.report.render import render_experiment
from specbench.report.tables import Entry, build_table, latex_escape, to_csv, to_latex, to_markdown

from .conftest import ROOT, run_cli
from .forked import run_module
from .limits import generous, wait_for

GOLDEN = Path(__file__).parent / "golden"
TABLE2 = ["+experiment=ouroboros_table2", "model=tiny_llama", "data=gsm8k", "data.limit=2", "data.max_new_tokens=12"]
REPORT_OVERRIDES = ["model=tiny_llama", "data.limit=2", "data.max_new_tokens=12"]


# --- hand-built entries -------------------------------------------------------------------------------

def spec(**extra):
    base = {"title": "T", "rows": [{"key": "data.name", "title": "Task"}, {"key": "method.name", "title": "Algorithm"}],
            "columns": [{"key": "model.name", "title": "Pair"}], "metrics": ["tok_per_s", "identical"],
            "highlight": {"metrics": ["tok_per_s"], "within": ["data.name"]}}
    return OmegaConf.create({**base, **extra})


def entry(data, method, pair, status="ok", interval=None, flagged=(), **values):
    return Entry(keys={"data.name": data, "method.name": method, "model.name": pair}, values=values, status=status,
                 intervals={"tok_per_s": interval} if interval else {}, flagged=set(flagged))


def test_table_marks_best_and_second_within_each_task_and_says_why_cells_are_missing():
    ours = [entry("gsm8k", "greedy", "tiny", tok_per_s=10.0, identical="(baseline)", interval=(9.0, 11.0)),
            entry("gsm8k", "speculative", "tiny", tok_per_s=30.0, identical="2/2", interval=(28.0, 32.0)),
            entry("gsm8k", "lookahead", "tiny", tok_per_s=20.0, identical="2/2", interval=(18.0, 22.0)),
            entry("cnndm", "greedy", "tiny", status="not run yet")]
    paper = [entry("gsm8k", "greedy", "yi", tok_per_s=15.33), entry("gsm8k", "eagle", "yi", tok_per_s=40.0)]
    table = build_table(spec(), ours, paper, known_methods={"greedy", "speculative", "lookahead"})
    md = to_markdown(table)
    rows = {tuple(r[:2]): r[2:] for r in table.rows}
    assert rows[("gsm8k", "speculative")][0] == "**30.00 [28.00, 32.00]**"
    assert rows[("gsm8k", "lookahead")][0] == "<u>20.00 [18.00, 22.00]</u>"
    assert rows[("gsm8k", "eagle")][-1] == "40.00"  # the paper publishes no intervals: its columns are not ranked
    assert rows[("cnndm", "greedy")][:2] == ["not run yet", ""]          # status once, in the first column
    assert rows[("gsm8k", "eagle")][:2] == ["not implemented", ""]       # a method we do not have
    assert rows[("gsm8k", "speculative")][2] == "not reported"           # the paper has no such cell
    assert table.header[2:] == ["tiny (ours) tok/s", "tiny (ours) identical to greedy", "yi (paper) tok/s"]
    assert "| gsm8k | speculative | **30.00 [28.00, 32.00]** | 2/2 | not reported |" in md
    tex = to_latex(table)
    assert r"\textbf{30.00 [28.00, 32.00]}" in tex and r"\underline{20.00 [18.00, 22.00]}" in tex
    assert r"\multicolumn{2}{c}{tiny}" in tex
    table.notes = ["speed-up over identical work; 95% intervals; ‡ too little identical work", "paper: Table 2"]
    tex = to_latex(table)  # the notes say what the columns are: kept under the table
    assert all(latex_escape(note) in tex for note in table.notes) and tex.index("Table 2") < tex.index(r"\caption")
    csv_text = to_csv(table)
    assert "gsm8k,speculative,tiny,ours,tok_per_s,30.0" in csv_text and "paper,tok_per_s,15.33" in csv_text


def marks_of(ours):
    table = build_table(spec(), ours, [], known_methods={"greedy", "speculative", "lookahead", "pld"})
    return {r[1]: r[2] for r in table.rows}


def test_no_mark_where_intervals_overlap_and_the_tied_say_so():
    # speculative's interval overlaps lookahead's: tied within noise, both marked ≈, neither bold; greedy is below both
    ours = [entry("g", "greedy", "p", tok_per_s=10.0, interval=(9.0, 11.0)),
            entry("g", "speculative", "p", tok_per_s=30.0, interval=(25.0, 35.0)),
            entry("g", "lookahead", "p", tok_per_s=28.0, interval=(26.0, 30.0))]
    cells = marks_of(ours)
    assert cells == {"greedy": "10.00 [9.00, 11.00]", "speculative": "30.00 [25.00, 35.00] ≈",
                     "lookahead": "28.00 [26.00, 30.00] ≈"}
    # the best separated from the rest, the second not from the third: bold, no underline
    ours[2] = entry("g", "lookahead", "p", tok_per_s=12.0, interval=(10.5, 13.0))
    ours[1] = entry("g", "speculative", "p", tok_per_s=30.0, interval=(28.0, 32.0))
    cells = marks_of(ours)
    assert cells["speculative"].startswith("**") and not cells["lookahead"].startswith("<u>")
    # a value without an interval: the group is not ranked at all
    ours[0] = entry("g", "greedy", "p", tok_per_s=10.0)
    assert not any(c.startswith(("**", "<u>")) or c.endswith("≈") for c in marks_of(ours).values())


def test_a_cell_over_too_little_identical_work_is_flagged_and_earns_no_mark():
    ours = [entry("g", "greedy", "p", tok_per_s=10.0, interval=(9.0, 11.0)),
            entry("g", "pld", "p", tok_per_s=40.0, interval=(38.0, 42.0), flagged=["tok_per_s"]),
            entry("g", "speculative", "p", tok_per_s=30.0, interval=(28.0, 32.0))]
    cells = marks_of(ours)
    # pld is clearly above the rest but unlike: it earns nothing, and speculative is not "best" beneath it
    assert cells["pld"] == "40.00 [38.00, 42.00] ‡"
    assert not cells["speculative"].startswith("**")
    ours[1] = entry("g", "pld", "p", tok_per_s=20.0, interval=(18.0, 22.0), flagged=["tok_per_s"])
    cells = marks_of(ours)
    assert cells["speculative"].startswith("**") and cells["pld"] == "20.00 [18.00, 22.00] ‡"  # not underlined
    ours[1] = entry("g", "pld", "p", tok_per_s=29.0, interval=(27.0, 31.0), flagged=["tok_per_s"])
    cells = marks_of(ours)  # overlapping the best: the best is tied with it, but the unlike cell earns no ≈ either
    assert cells["speculative"].endswith("≈") and cells["pld"] == "29.00 [27.00, 31.00] ‡"


def test_repeats_print_mean_and_std():
    ours = [Entry(keys={"data.name": "g", "method.name": "greedy", "model.name": "p"}, values={"tok_per_s": 12.0},
                  stds={"tok_per_s": 0.5})]
    table = build_table(spec(highlight=None), ours, [], known_methods={"greedy"})
    assert table.rows[0][2] == "12.00 ± 0.50"


def test_sweep_grid_takes_command_line_values_over_the_experiment():
    params = {"data": "gsm8k,cnndm", "method": "greedy,speculative"}
    jobs = expand_grid(params, ["data=humaneval", "method.gamma=3,5"])
    assert jobs == [["method=greedy", "data=humaneval", "method.gamma=3"],
                    ["method=greedy", "data=humaneval", "method.gamma=5"],
                    ["method=speculative", "data=humaneval", "method.gamma=3"],
                    ["method=speculative", "data=humaneval", "method.gamma=5"]]


def test_unknown_experiment_and_bad_figure_are_clear_errors(tmp_path):
    with pytest.raises(ConfigError, match="available: .*ouroboros_table2"):
        load_experiment("ouroboros_tabel2")
    with pytest.raises(ConfigError, match="experiment.figures: 'pie'"):
        render_experiment("ouroboros_fig5", ["model=tiny_llama", "experiment.figures=[pie]",
                                             f"runner.records_dir={tmp_path}"], out=tmp_path)


@pytest.mark.parametrize("name", sorted(p.stem for p in (ROOT / "conf" / "experiment").glob("*.yaml")))
def test_every_experiment_renders_before_anything_ran(tmp_path, name):
    """Every experiment composes, expands its sweep and renders: our cells say why they are empty, the
    paper's numbers are there."""
    result = render_experiment(name, [f"runner.records_dir={tmp_path / 'records'}",
                                      f"+experiment.disco_overrides=['disco.out_dir={tmp_path / 'disco'}']"]
                               if name.startswith("disco") else [f"runner.records_dir={tmp_path / 'records'}"],
                               out=tmp_path / "reports")
    md = result["markdown"]
    assert "not run yet" in md
    assert result["paths"]["md"].exists() and result["paths"]["tex"].exists() and result["paths"]["csv"].exists()
    if result["experiment"].spec.get("published"):
        assert "(paper)" in md and "paper columns: Source:" in md


@pytest.mark.parametrize("name, paper", [
    ("griffin_table2", {"GRIFFIN": "5.11", "w/o both (EAGLE-2)": "4.44", "w/o TAT": "4.85", "w/o TAD": "4.94"}),
    ("griffin_table3", {"1": "5.03", "3 (GRIFFIN)": "5.11", "5": "5.09", "10": "5.05", "NA": "4.95"}),
    ("griffin_table5", {"token (GRIFFIN)": "5.11", "feature": "4.44", "fused": "4.85"}),
])
def test_griffin_ablation_rows_sit_beside_the_papers(tmp_path, name, paper):
    """Rows are keyed by method only: the paper's LLaMA2-Chat 7B τ lands in the row of our head of that name."""
    table = render_experiment(name, [f"runner.records_dir={tmp_path}"], out=tmp_path)["table"]
    rows = {r[0]: r[1:] for r in table.rows}
    assert table.header[:3] == [table.header[0], "T=0, MT-bench (ours) τ", "T=0, MT-bench (paper) τ"]
    assert {k: v[:2] for k, v in rows.items()} == {k: ["not run yet", tau] for k, tau in paper.items()}
    assert len(table.header) == 1 + 2 * 6  # T x task, ours and the paper's in each


def test_griffin_table1_maps_the_papers_eagle_rows(tmp_path):
    table = render_experiment("griffin_table1", [f"runner.records_dir={tmp_path}"], out=tmp_path)["table"]
    rows = {tuple(r[:2]): r[2:] for r in table.rows}
    assert rows[("vicuna-7b-68m", "EAGLE-2")][:2] == ["not run yet", ""]       # our eagle: EAGLE-2's tree
    assert rows[("vicuna-7b-68m", "EAGLE")][0] == "not in this sweep"          # EAGLE-1: ours, needs a head
    assert rows[("vicuna-7b-68m", "FSPAD")][0] == "not implemented"            # the paper's only
    assert any("3.56×" in c for c in rows[("vicuna-7b-68m", "EAGLE-2")])   # the paper's EAGLE-2 SR, T=0 MT-bench
    assert any("2.90×" in c for c in rows[("vicuna-7b-68m", "EAGLE")])
    assert rows[("vicuna-7b-68m", "GRIFFIN")][0] == "not run yet"


# --- a tiny-model sweep -------------------------------------------------------------------------------

@pytest.fixture(scope="module")
def table2_sweep(tmp_path_factory):
    """Ouroboros Table 2's sweep on the tiny pair, GSM8K only (5 jobs, basic launcher)."""
    root = tmp_path_factory.mktemp("table2")
    run_cli("-m", *TABLE2, records_dir=root / "records")
    return root


TIMING = r"(\*\*|<u>)?[\d.]+×?( ± [\d.]+)?( \[[\d.]+, [\d.]+\])?( ‡)?(\*\*|</u>| ≈)?"  # a timing cell, marks included


def normalise(markdown: str) -> list[list[str]]:
    """Table cells, with our timing columns (tok/s, speed-up: machine-dependent) reduced to '#' and their
    bold/underline marks dropped; everything else (structure, τ, identity, paper numbers) stays exact."""
    lines = [line for line in markdown.splitlines() if line.startswith("|")]
    header = [c.strip() for c in lines[0].strip("|").split("|")]
    timing = {i for i, h in enumerate(header) if "(ours)" in h and ("tok/s" in h or "speed-up" in h)}
    rows = []
    for line in lines:
        cells = [c.strip() for c in line.strip("|").split("|")]
        rows.append(["#" if i in timing and re.fullmatch(TIMING, c) else c for i, c in enumerate(cells)])
    return rows


def test_golden_markdown_table_from_a_tiny_sweep(table2_sweep, tmp_path):
    records = table2_sweep / "records"
    result = render_experiment("ouroboros_table2", [*REPORT_OVERRIDES, f"runner.records_dir={records}"], out=tmp_path)
    expected = (GOLDEN / "ouroboros_table2_tiny.md").read_text()
    got, want = normalise(result["markdown"]), normalise(expected)
    assert len(got) == len(want), result["markdown"]
    for g, w in zip(got, want):
        assert g == w, f"\n got: {g}\nwant: {w}"
    notes = [line for line in result["markdown"].splitlines() if line.startswith("- ")]
    assert any("paper columns: Source: Zhao et al. 2024" in n for n in notes)
    ours = next(n for n in notes if n.startswith("- ours: tiny-llama (float32) on "))
    assert "; torch " in ours  # the CPU named with family, model and flags, not its marketing name alone


def test_figures_exist_for_an_experiment_with_data(table2_sweep, tmp_path):
    records = table2_sweep / "records"
    result = render_experiment("ouroboros_table2", [*REPORT_OVERRIDES, f"runner.records_dir={records}"], out=tmp_path)
    for name in ("speed_bars", "tau_speedup"):
        for suffix in ("png", "pdf"):
            path = result["paths"][f"{name}.{suffix}"]
            assert path.exists() and path.stat().st_size > 5000, path


def test_report_logs_a_wandb_report_run_offline(table2_sweep, tmp_path, monkeypatch):
    monkeypatch.setenv("WANDB_MODE", "offline")
    render_experiment("ouroboros_table2", [*REPORT_OVERRIDES, f"runner.records_dir={table2_sweep / 'records'}"],
                      out=tmp_path / "reports", logger="wandb", logger_dir=tmp_path / "wandb")
    runs = list((tmp_path / "wandb").rglob("offline-run-*"))
    assert runs and any(p.suffix == ".wandb" for p in runs[0].rglob("*"))


def report_cli(*args: str, env: dict | None = None) -> subprocess.CompletedProcess:
    return run_module("specbench.report", *args, timeout=generous(300), env=env)


def test_report_cli_renders_a_sweep_from_its_overrides_and_logs_to_wandb(table2_sweep, tmp_path):
    """The report's own keys (experiment, paths, logger) beside the sweep's overrides, in sweep syntax."""
    proc = report_cli("+experiment=ouroboros_table2", *REPORT_OVERRIDES, "method=greedy,speculative",
                      f"paths.root={tmp_path / 'runs'}", f"paths.records={table2_sweep / 'records'}", "logger=wandb",
                      f"logger.dir={tmp_path / 'wandb'}", env={**os.environ, "WANDB_MODE": "offline"})
    assert proc.returncode == 0, proc.stderr[-3000:]
    rows = {tuple(cells[:2]): cells[2:] for cells in normalise(proc.stdout)}
    assert rows[("GSM8K", "Speculative")][0] == "#", proc.stdout      # measured: paths.records reached every cell
    assert rows[("GSM8K", "Lookahead")][0] == "not in this sweep"     # method=greedy,speculative reached the sweep
    md = tmp_path / "runs" / "reports" / "ouroboros_table2" / "ouroboros_table2.md"  # out: paths.reports
    assert md.read_text().strip() == proc.stdout.strip() and f"[report] md: {md}" in proc.stderr
    assert list((tmp_path / "runs" / "hydra" / "report").iterdir())  # Hydra's own outputs under paths.hydra
    assert list((tmp_path / "wandb" / "wandb").glob("offline-run-*"))  # where `wandb sync` finds them


def test_report_command_line_keeps_the_sweeps_overrides_as_written():
    from hydra.core.override_parser.overrides_parser import OverridesParser

    from specbench.report.__main__ import command_line

    flags, own, sweep = command_line(["--cfg", "job", "+experiment=ouroboros_table2", "model=embedded", "out=/o",
                                      "method=greedy,speculative", "logger=wandb", "logger.dir=/w", "paths.root=/r",
                                      "+experiment.disco_overrides=['disco.out_dir=x,y']", "hydra.run.dir=/h",
                                      "data.limit=4", r"data.path='C:\\it\'s, a,b\\'"])
    assert flags == ["--cfg", "job"]
    assert own[:-1] == ["experiment=ouroboros_table2", "out=/o", "logger=wandb", "logger.dir=/w", "paths.root=/r",
                        "hydra.run.dir=/h"]
    assert sweep == ["model=embedded", "method=greedy,speculative", "paths.root=/r",
                     "+experiment.disco_overrides=['disco.out_dir=x,y']", "data.limit=4",
                     r"data.path='C:\\it\'s, a,b\\'"]
    key, _, value = own[-1].partition("=")
    assert key == "overrides" and OverridesParser.create().parse_override(own[-1]).value() == sweep
    with pytest.raises(ConfigError, match="overrides: give the sweep's overrides"):
        command_line(["experiment=ouroboros_table2", "overrides=['model=embedded']", "data=gsm8k"])


@pytest.mark.parametrize("args, message", [
    ([], "experiment=<name> is required; available: ['backends', 'disco_table1'"),
    (["experiment=ouroboros_tabel2"], "Could not find 'experiment/ouroboros_tabel2'; Available options in 'experim"),
    (["experiment=ouroboros_table2", "data.limit=0"], "data.limit: must be a positive integer or null, got 0"),
    (["experiment=ouroboros_table2", "method=nosuch"], "Could not find 'method/nosuch'; Available options in 'method'"),
])
def test_report_cli_bad_input_is_one_line_naming_the_key_and_exit_2(tmp_path, args, message):
    proc = report_cli(*args, f"paths.root={tmp_path}")
    lines = proc.stderr.strip().splitlines()
    assert proc.returncode == 2 and len(lines) == 1, proc.stderr
    assert lines[0].startswith("specbench.report: error: ") and message in lines[0], lines[0]
    assert not (tmp_path / "reports").exists()


def test_report_help_lists_experiments_and_keys():
    proc = report_cli("--help")
    assert proc.returncode == 0
    for text in ("experiment=NAME", "ouroboros_table2, ouroboros_table3", "out=DIR", "logger=wandb", "logger.dir=DIR",
                 "paths.root=DIR", "data.limit=N"):
        assert text in proc.stdout, text


def test_report_rejects_a_bad_wandb_mode_before_any_work(tmp_path):
    with pytest.raises(ConfigError, match="logger.mode: 'sometimes' is not one of auto"):
        render_experiment("ouroboros_table2", [f"runner.records_dir={tmp_path}"], out=tmp_path / "reports",
                          logger="wandb", logger_options={"mode": "sometimes"})
    assert not (tmp_path / "reports").exists()


def test_notebook_executes_against_tiny_records(table2_sweep, tmp_path):
    import nbformat
    from nbclient import NotebookClient

    nb = nbformat.read(ROOT / "notebooks" / "results.ipynb", as_version=4)
    env = {"SPECBENCH_EXPERIMENT": "ouroboros_table2", "SPECBENCH_REPORT_OUT": str(tmp_path),
           "SPECBENCH_OVERRIDES": json.dumps([*REPORT_OVERRIDES, f"runner.records_dir={table2_sweep / 'records'}"])}
    old = {k: os.environ.get(k) for k in env}
    os.environ.update(env)
    try:
        NotebookClient(nb, timeout=int(generous(300)), kernel_name="python3",
                       resources={"metadata": {"path": str(ROOT / "notebooks")}}).execute()
    finally:
        for k, v in old.items():
            os.environ.pop(k) if v is None else os.environ.__setitem__(k, v)
    outputs = [o for c in nb.cells if c.cell_type == "code" for o in c.outputs]
    assert not [o for o in outputs if o.get("output_type") == "error"]
    markdown = [o["data"]["text/markdown"] for o in outputs if "text/markdown" in o.get("data", {})]
    assert markdown and "| GSM8K | Ouroboros† |" in markdown[0]
    assert sum("image/png" in o.get("data", {}) for o in outputs) >= 2


# --- launchers and interruption -----------------------------------------------------------------------

def record_lines(records_dir: Path) -> dict[str, list[str]]:
    return {p.name: p.read_text().splitlines() for p in sorted(records_dir.rglob("*.jsonl"))}


def assert_clean_records(records_dir: Path, prompts: int, files: int, paired_jobs: int, orphans: int = 0):
    """Whole JSON lines, no duplicates; each method once per prompt; the greedy baseline once per prompt for its
    own job and once per prompt for each job it was paired with (``paired_jobs``), plus at most ``orphans``
    baselines whose method record a kill cut off (ignored: no method record points at their round)."""
    lines = record_lines(records_dir)
    assert len(lines) == files, sorted(lines)
    for name, rows in lines.items():
        parsed = [json.loads(r) for r in rows]  # every line is whole JSON
        keys = [(r["prompt_id"], r["repeat"], r["pairing"]["round"]) for r in parsed]
        expected = prompts * paired_jobs if name.startswith("greedy") else prompts
        # greedy's own job measures only if it runs before the others (else it resumes from their baselines)
        spare = prompts + orphans if name.startswith("greedy") else 0
        assert len(keys) == len(set(keys)) and expected <= len(keys) <= expected + spare, (name, keys)


@pytest.mark.parametrize("launcher", ["joblib", "submitit_local"])
def test_parallel_launchers_complete_and_the_report_sees_every_job(tmp_path, launcher):
    records = tmp_path / "records"
    extra = ["hydra.launcher.n_jobs=2"] if launcher == "joblib" else []
    run_cli("-m", *TABLE2, "method=greedy,speculative,lookahead,ouroboros", f"hydra/launcher={launcher}", *extra,
            records_dir=records)
    assert_clean_records(records, prompts=2, files=4, paired_jobs=3)  # jobs sharing the greedy file take turns
    exp = render_experiment("ouroboros_table2", [*REPORT_OVERRIDES, f"runner.records_dir={records}",
                                                 "method=greedy,speculative,lookahead,ouroboros"],
                            out=tmp_path)["experiment"]
    gsm8k = [c for c in exp.cells if c.value("data.name") == "gsm8k"]
    assert len(gsm8k) == 4 and all(c.status == "ok" for c in gsm8k)


def test_killed_sweep_reruns_only_missing_work(tmp_path):
    records = tmp_path / "records"
    args = [sys.executable, "-m", "specbench", "-m", *TABLE2[:3], "data.limit=5", "data.max_new_tokens=64",
            f"runner.records_dir={records}", f"hydra.sweep.dir={tmp_path / 'multirun'}", "runner.progress=false"]
    proc = subprocess.Popen(args, cwd=ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                            start_new_session=True)

    def third_job_writing():  # the third job of five (lookahead) has written a record
        return any(f.read_text().count("\n") >= 1 for f in records.rglob("lookahead-*.jsonl"))

    wait_for(third_job_writing, proc, "the third job's first record", seconds=240, poll_s=0.01)
    os.killpg(proc.pid, signal.SIGKILL)  # a crash: no cleanup, maybe mid-write
    proc.wait(timeout=generous(60))
    before = record_lines(records)
    done = {n: rows for n, rows in before.items() if len(rows) == 5 and not n.startswith("greedy")}
    assert any(n.startswith("speculative") for n in done)
    greedy = next(v for n, v in before.items() if n.startswith("greedy"))
    assert sum(json.loads(r)["pairing"]["round"] is None for r in greedy) == 5
    assert not any(n.startswith("ouroboros_warm") for n in before), "the sweep must be cut mid-way"

    rerun = run_cli("-m", *TABLE2[:3], "data.limit=5", "data.max_new_tokens=64", records_dir=records)
    after = record_lines(records)
    for name, rows in done.items():
        assert after[name] == rows, f"{name}: a finished job was redone"
    for name, rows in before.items():
        complete = [r for r in rows if r.endswith("}")]
        assert after[name][: len(complete)] == complete, f"{name}: finished records were rewritten"
    assert rerun.stderr.count("5 record(s) kept, 0 to run") >= 2  # greedy's own job and speculative's
    assert_clean_records(records, prompts=5, files=5, paired_jobs=4, orphans=1)


# --- the other figures, each from a small tiny-model sweep of its experiment ----------------------------

@pytest.mark.parametrize("name, sweep, figure", [
    ("ouroboros_fig5", ["data.limit=1", "method.top_k=1,3"], "topk_curve"),
    ("ouroboros_table1", ["data=gsm8k", "data.limit=1"], "match_k_bars"),
])
def test_experiment_figures_from_tiny_sweeps(tmp_path, name, sweep, figure):
    records = tmp_path / "records"
    common = ["model=tiny_llama", "data.max_new_tokens=24", f"runner.records_dir={records}"]
    run_cli("-m", f"+experiment={name}", *common, *sweep, records_dir=records)
    result = render_experiment(name, [*common, *sweep], out=tmp_path / "reports")
    assert all(c.status == "ok" for c in result["experiment"].cells)
    assert result["paths"][f"{figure}.png"].stat().st_size > 5000
    if name == "ouroboros_table1":  # our measured len(LCP) and #Match-k beside the paper's Table 1
        row = next(r for r in result["table"].rows if r[0] == "gsm8k")
        assert all(re.fullmatch(r"[\d.]+", c) for c in row[1:7]), row


def test_ablation_sweep_rows_land_on_the_papers_rows(tmp_path):
    records = tmp_path / "records"
    common = ["model=tiny_llama", "data.limit=1", "data.max_new_tokens=16", "method.gamma=4", "method.window=4",
              "method.beta=3"]
    run_cli("-m", "+experiment=ouroboros_table3", *common, "ouroboros_ablation@method=none,all", records_dir=records)
    table = render_experiment("ouroboros_table3", [*common, f"runner.records_dir={records}"], out=tmp_path)["table"]
    rows = {tuple(r[:3]): r[3:] for r in table.rows}
    for flags in (("", "", ""), ("✓", "✓", "✓")):
        assert re.fullmatch(r"(\*\*|<u>)?[\d.]+(\*\*|</u>)?", rows[flags][0]), rows[flags]   # ours, measured
    # the paper's best, as published: its columns publish no intervals and are not ranked
    assert rows[("✓", "", "")][0] == "not run yet" and rows[("✓", "✓", "✓")][-1] == "58.18"


def test_optuna_search_runs_trials_and_reports_the_best(tmp_path):
    records = tmp_path / "records"
    run_cli("-m", "+search=ouroboros_optuna", "data.limit=1", "data.max_new_tokens=12", "hydra.sweeper.n_trials=2",
            "hydra.sweeper.sampler.n_startup_trials=2", records_dir=records)
    result = OmegaConf.load(tmp_path / "multirun" / "optimization_results.yaml")
    assert result.best_value > 0 and set(result.best_params) == {"method.gamma", "method.window", "method.beta",
                                                                 "method.top_k"}
    assert 1 <= len(list(records.rglob("ouroboros-*.jsonl"))) <= 2 and len(list(records.rglob("greedy-*.jsonl"))) == 1


def test_notes_warn_about_concurrent_timing_and_far_apart_baselines():
    from types import SimpleNamespace

    from specbench.report.paper import baseline_gap_hours, concurrent_cells
    from specbench.records.schema import RunRecord

    def rec(method, end, wall=10.0, host="h", prompt="p1", round_id=None):
        return RunRecord(method=method, data="gsm8k", run_key=method, prompt_id=prompt, repeat=0, timestamp=end,
                         wall_s=wall, env={"hostname": host}, pairing={"round": round_id})

    def cell(method, records, baseline=()):
        return SimpleNamespace(records=records, baseline_records=list(baseline),
                               spec=SimpleNamespace(method=method, data="gsm8k"))

    a = cell("speculative", [rec("speculative", 100.0), rec("speculative", 110.0, prompt="p2")],
             baseline=[rec("greedy", 100.0 + 7200)])
    b = cell("lookahead", [rec("lookahead", 105.0)])           # timed 95..105: inside a's 90..110
    c = cell("ouroboros", [rec("ouroboros", 500.0)])
    d = cell("ouroboros_warm", [rec("ouroboros_warm", 105.0, host="other")])  # another machine: no interference
    assert concurrent_cells(SimpleNamespace(cells=[a, b, c, d])) == ["lookahead@gsm8k / speculative@gsm8k"]
    assert abs(baseline_gap_hours(a) - (7300 - 110) / 3600) < 1e-9 and baseline_gap_hours(b) == 0.0

    # paired rounds, one after another: greedy then the method, the greedy cell reusing the same baseline records
    g1, g2 = rec("greedy", 1010.0, round_id="r1"), rec("greedy", 1030.0, round_id="r2")
    paired = cell("speculative", [rec("speculative", 1020.0, round_id="r1"), rec("speculative", 1040.0, round_id="r2")],
                  baseline=[g1, g2])
    assert concurrent_cells(SimpleNamespace(cells=[paired, cell("greedy", [g1, g2])])) == []


def test_a_failed_job_does_not_stop_the_sweep_and_its_cell_says_why(tmp_path):
    records = tmp_path / "records"
    common = ["model=tiny_llama", "data=gsm8k", "data.limit=1", "data.max_new_tokens=8", "sampling.temperature=1"]
    common.append("method=oracle_sl,speculative")  # the oracle SL needs temperature 0: its job fails
    proc = run_cli("-m", "+experiment=griffin_table1", *common, records_dir=records, check=False)
    assert proc.returncode != 0 and "supports temperature 0 only" in proc.stderr
    table = render_experiment("griffin_table1", [*common, f"runner.records_dir={records}"], out=tmp_path)["table"]
    rows = {r[1]: r[2:] for r in table.rows if r[0] == "tiny-llama"}
    assert rows["oracle_sl"][0].startswith("failed: sampling.temperature: method 'oracle_sl'")
    assert re.fullmatch(r"(\*\*|<u>)?[\d.]+×(\*\*|</u>)?", rows["SPS"][0]), rows["SPS"]  # the job after it ran


# methods the papers compare against that we do not implement: their rows show the paper's numbers only
PAPER_ONLY_METHODS = {"fspad", "hass"}


def test_published_rows_name_our_methods_so_ours_land_beside_them():
    import csv

    from specbench.report.paper import PUBLISHED_DIR, known_methods
    for path in sorted(PUBLISHED_DIR.glob("*.csv")):
        rows = csv.DictReader(line for line in path.read_text().splitlines() if not line.startswith("#"))
        names = {row["method.name"] for row in rows if "method.name" in row}
        unknown = names - known_methods() - PAPER_ONLY_METHODS
        assert not unknown, (f"{path.name}: method.name {sorted(unknown)} is neither a conf/method config, a head's "
                             "name (conf/head: method.head=<name>) nor paper-only")


def test_backends_experiment_puts_each_backend_beside_its_bound(tmp_path):
    """+experiment=backends on the tiny GGUF pair (the same weights on transformers and on llama.cpp): one column
    per backend, each method's speed-up beside the bound and efficiency its run measured (costs.run_bound)."""
    pytest.importorskip("llama_cpp")
    records = tmp_path / "records"
    sweep = ["model=tiny_gguf", "data=gsm8k", "data.limit=1", "data.max_new_tokens=16", "method=greedy,speculative",
             f"runner.records_dir={records}"]
    run_cli("-m", "+experiment=backends", *sweep, records_dir=records, expect_s=600)
    result = render_experiment("backends", sweep, out=tmp_path / "reports")
    cells = result["experiment"].cells
    assert {c.value("model.backend") for c in cells} == {"transformers", "llamacpp"}
    assert all(c.status == "ok" for c in cells), [c.status for c in cells]
    markdown = result["markdown"]
    assert "transformers" in markdown and "llama.cpp" in markdown
    assert "ours: measured at commit " in markdown and "`python -m specbench.report experiment=backends " in markdown
    speculative = [c for c in cells if c.value("method.name") == "speculative"]
    for cell in speculative:
        bound = cell.summary["bound"]
        assert bound["bound"] > 0 and bound["efficiency"] > 0 and bound["verify_ratio"]["k"] > 1
    row = next(r for r in result["table"].rows if "Speculative" in r)
    assert sum(bool(re.fullmatch(r"[\d.]+ \(k=\d+\)", c)) for c in row) == 2, markdown  # T(k)/T(1), each backend
