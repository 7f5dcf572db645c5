"""End-to-end: the CLI on a tiny model writes records and a summary, sweeps, resumes, logs to W&B offline."""
import json
import os
import signal
import subprocess
import sys

from specbench.analysis.summary import undeclared

from .conftest import ROOT, run_cli
from .limits import generous, wait_for


def load_records(records_dir, method):
    files = sorted(records_dir.rglob(f"{method}-*.jsonl"))
    assert len(files) == 1, files
    return [json.loads(line) for line in files[0].read_text().splitlines()]


def test_cli_run_writes_records_and_summary(tmp_path):
    records = tmp_path / "records"
    proc = run_cli("method=speculative", "data=gsm8k", "data.limit=3", "data.max_new_tokens=24", records_dir=records)
    assert "lossless: 3/3 (3 identical)" in proc.stdout
    for key in ("tokens/s", "speedup vs greedy", "tau", "acceptance rate"):
        assert key in proc.stdout
    spec = load_records(records, "speculative")
    greedy = load_records(records, "greedy")
    assert len(spec) == len(greedy) == 3
    rec = spec[0]
    for field in ("prompt_id", "output_ids", "new_tokens", "wall_s", "prefill_s", "target_forwards", "drafted",
                  "accepted", "accept_lengths", "env", "config", "run_key"):
        assert field in rec, field
    assert rec["env"]["versions"]["torch"] and rec["config"]["method"]["gamma"] == 4
    assert 0 < rec["prefill_s"] < rec["wall_s"]
    assert [r["output_ids"] for r in spec] == [r["output_ids"] for r in greedy]
    summary = json.loads(next(records.rglob("speculative-*.summary.json")).read_text())
    assert summary["identical"] == 3 and summary["compared"] == 3
    assert undeclared(summary) == set()  # every key it holds is one analysis/summary.Summary declares
    # the summary's numbers are the records' (pairs by round id: baseline wall / method wall, mean over prompts)
    by_round = {r["pairing"]["round"]: r["wall_s"] for r in greedy}
    ratios = [by_round[r["pairing"]["round"]] / r["wall_s"] for r in spec]
    assert abs(summary["speedup"] - sum(ratios) / 3) < 1e-9
    steps = [n for r in spec for n in r["accept_lengths"]]
    assert abs(summary["tau"] - sum(steps) / len(steps)) < 1e-9 and sum(steps) == sum(r["new_tokens"] for r in spec)


def test_rerun_resumes_and_larger_limit_adds_only_new_prompts(tmp_path):
    records = tmp_path / "records"
    run_cli("method=greedy", "data.limit=2", "data.max_new_tokens=8", records_dir=records)
    first = load_records(records, "greedy")
    proc = run_cli("method=greedy", "data.limit=2", "data.max_new_tokens=8", records_dir=records)
    assert "resuming, 2 record(s) kept, 0 to run" in proc.stderr
    run_cli("method=greedy", "data.limit=3", "data.max_new_tokens=8", records_dir=records)
    after = load_records(records, "greedy")
    assert len(after) == 3 and after[:2] == first


def test_interrupted_run_keeps_finished_records_and_does_not_redo_them(tmp_path):
    records = tmp_path / "records"
    args = [sys.executable, "-m", "specbench", "model=tiny_llama", "method=greedy", "data.limit=16",
            "data.max_new_tokens=256", f"runner.records_dir={records}", f"hydra.run.dir={tmp_path / 'hydra'}",
            "runner.progress=false"]
    # Ctrl-C must reach the child even when this test runs in a background job (which ignores SIGINT, and a
    # Python started with SIGINT ignored never raises KeyboardInterrupt)
    proc = subprocess.Popen(args, cwd=ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                            preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))

    def two_records_written():
        return any(len(f.read_text().splitlines()) >= 2 for f in records.rglob("greedy-*.jsonl"))

    wait_for(two_records_written, proc, "two records written")
    files = list(records.rglob("greedy-*.jsonl"))
    proc.send_signal(signal.SIGINT)  # Ctrl-C in the middle of the run
    proc.wait(timeout=generous(60))
    kept = [json.loads(line) for line in files[0].read_text().splitlines()]
    assert 2 <= len(kept) < 16, "the run must be cut mid-way for this test to mean anything"
    run_cli("method=greedy", "data.limit=16", "data.max_new_tokens=256", records_dir=records)
    final = load_records(records, "greedy")
    assert final[: len(kept)] == kept, "finished records are kept as they were"
    ids = [(r["prompt_id"], r["repeat"]) for r in final]
    assert len(ids) == len(set(ids)) == 16, "no prompt is redone or lost"


def test_multirun_sweep_with_basic_launcher(tmp_path):
    records = tmp_path / "records"
    run_cli("-m", "method=greedy,speculative,hf_assisted", "data.limit=2", "data.max_new_tokens=12",
            records_dir=records)
    for method in ("speculative", "hf_assisted"):
        assert len(load_records(records, method)) == 2
    greedy = load_records(records, "greedy")
    # greedy's own job (timed alone), then one baseline per prompt in each method's paired rounds
    assert len(greedy) == 6 and sum(r["pairing"]["round"] is None for r in greedy) == 2
    hf = load_records(records, "hf_assisted")
    assert [r["output_ids"] for r in hf] == [r["output_ids"] for r in greedy[:2]]


def test_repeats_give_mean_and_std(tmp_path):
    records = tmp_path / "records"
    run_cli("method=speculative", "data.limit=2", "data.max_new_tokens=12", "runner.repeats=2", records_dir=records)
    assert sorted((r["prompt_id"], r["repeat"]) for r in load_records(records, "speculative"))[1][1] == 1
    summary = json.loads(next(records.rglob("speculative-*.summary.json")).read_text())
    assert summary["repeats"] == 2 and summary["speedup_std"] is not None


def test_sampling_run_reports_no_identity_claim(tmp_path):
    records = tmp_path / "records"
    proc = run_cli("method=speculative", "data.limit=2", "data.max_new_tokens=12", "sampling.temperature=0.8",
                   "sampling.top_p=0.9", records_dir=records)
    assert "identical to greedy:" not in proc.stdout and "lossless:" not in proc.stdout
    assert len(load_records(records, "speculative")) == 2


def test_wandb_offline_logging(tmp_path):
    records = tmp_path / "records"
    env_backup = os.environ.pop("WANDB_MODE", None)
    try:
        run_cli("method=speculative", "data.limit=2", "data.max_new_tokens=8", "logger=wandb", "logger.mode=offline",
                f"logger.dir={tmp_path / 'wandb'}", records_dir=records)
    finally:
        if env_backup is not None:
            os.environ["WANDB_MODE"] = env_backup
    runs = list((tmp_path / "wandb").rglob("offline-run-*"))
    assert runs, "an offline W&B run directory is written"
    assert any(p.suffix == ".wandb" for p in runs[0].rglob("*"))


def test_baseline_skip_uses_existing_records_or_says_how_to_get_them(tmp_path):
    records = tmp_path / "records"
    proc = run_cli("method=speculative", "runner.baseline=skip", "data.limit=2", "data.max_new_tokens=8",
                   records_dir=records)
    assert "re-run with runner.baseline=auto" in proc.stderr and "speedup vs greedy" not in proc.stdout
    assert not list(records.rglob("greedy-*.jsonl"))
    run_cli("method=greedy", "data.limit=2", "data.max_new_tokens=8", records_dir=records)
    proc = run_cli("method=speculative", "runner.baseline=skip", "data.limit=2", "data.max_new_tokens=8",
                   records_dir=records)
    assert "lossless: 2/2 (" in proc.stdout
