"""Paired, interleaved baselines: per-round ratios, bootstrap intervals, alternating order, resume."""
import json
import signal
import subprocess
import sys

import pytest

from specbench.analysis.metrics import bootstrap_mean_ci, compare
from specbench.records.schema import RunRecord

from .conftest import ROOT, run_cli
from .limits import generous, wait_for


def rec(prompt, wall, round_id=None, repeat=0, tokens=10, ids=(1, 2, 3)):
    return RunRecord(prompt_id=prompt, repeat=repeat, new_tokens=tokens, wall_s=wall, output_ids=list(ids),
                     pairing={"round": round_id})


def test_paired_speedup_is_the_mean_of_round_ratios_and_ignores_other_rounds():
    method = [rec("p1", 1.0, "r1"), rec("p2", 2.0, "r2")]
    baseline = [rec("p1", 2.0, "r1"), rec("p2", 3.0, "r2"), rec("p1", 100.0, "r9")]  # r9: another run's pair
    s = compare(method, baseline)
    assert s["paired"] and s["pairs"] == 2
    assert abs(s["speedup"] - (2.0 + 1.5) / 2) < 1e-12
    assert abs(s["speedup_total"] - (20 / 3) / (20 / 5)) < 1e-12
    lo, hi = s["speedup_ci95"]
    assert 1.5 <= lo <= s["speedup"] <= hi <= 2.0
    assert s["identical"] == s["compared"] == 2


def test_repeats_are_averaged_per_prompt_before_the_mean():
    method = [rec("p1", 1.0, "a"), rec("p1", 1.0, "b", repeat=1), rec("p2", 1.0, "c")]
    baseline = [rec("p1", 2.0, "a"), rec("p1", 4.0, "b", repeat=1), rec("p2", 1.0, "c")]
    s = compare(method, baseline)
    assert abs(s["speedup"] - ((2.0 + 4.0) / 2 + 1.0) / 2) < 1e-12


def test_unpaired_records_fall_back_to_throughput_ratio_and_say_so():
    s = compare([rec("p1", 1.0), rec("p2", 1.0)], [rec("p1", 2.0), rec("p2", 4.0)])
    assert s["paired"] is False and s["speedup_ci95"] is None
    assert abs(s["speedup"] - (20 / 2) / (20 / 6)) < 1e-12


def test_bootstrap_interval_is_deterministic_and_brackets_the_mean():
    values = [[1.1], [1.3], [1.2], [1.6], [0.9]]
    ci = bootstrap_mean_ci(values)
    assert ci == bootstrap_mean_ci(values)
    assert ci[0] < 1.22 < ci[1] and 0.9 <= ci[0] and ci[1] <= 1.6
    assert bootstrap_mean_ci([[1.0]]) is None
    assert bootstrap_mean_ci([[1.0, 1.2, 1.4]]) is not None  # one prompt, repeats: resample the repeats


def load(records_dir, method):
    (path,) = records_dir.rglob(f"{method}-*.jsonl")
    return [json.loads(line) for line in path.read_text().splitlines()]


def test_interleaved_rounds_alternate_order_share_round_ids_and_resume(tmp_path):
    records = tmp_path / "records"
    run_cli("method=speculative", "data.limit=2", "data.max_new_tokens=8", records_dir=records)
    spec, greedy = load(records, "speculative"), load(records, "greedy")
    assert len(spec) == len(greedy) == 2
    by_round = {g["pairing"]["round"]: g for g in greedy}
    for s in spec:
        g = by_round[s["pairing"]["round"]]  # every method record has its baseline, from the same process
        assert g["prompt_id"] == s["prompt_id"] and g["pairing"]["session"] == s["pairing"]["session"]
        assert s["pairing"]["mode"] == "interleaved"
    first, second = sorted(spec, key=lambda r: r["prompt_index"])
    assert first["pairing"]["position"] == 1 and second["pairing"]["position"] == 0  # greedy first, then method first

    proc = run_cli("method=speculative", "data.limit=3", "data.max_new_tokens=8", records_dir=records)
    assert "resuming, 2 record(s) kept, 1 to run" in proc.stderr
    assert len(load(records, "speculative")) == 3 and len(load(records, "greedy")) == 3, \
        "a finished pair is never redone"

    # another method, another process: its own baseline measurements, never the earlier rounds
    proc = run_cli("method=lookahead", "data.limit=3", "data.max_new_tokens=8", records_dir=records)
    greedy = load(records, "greedy")
    assert len(greedy) == 6
    look_rounds = {r["pairing"]["round"] for r in load(records, "lookahead")}
    spec_rounds = {r["pairing"]["round"] for r in load(records, "speculative")}
    assert not look_rounds & spec_rounds and look_rounds <= {g["pairing"]["round"] for g in greedy}
    summary = json.loads(next(records.rglob("lookahead-*.summary.json")).read_text())
    assert summary["paired"] and summary["pairs"] == 3 and len(summary["speedup_ci95"]) == 2
    assert "paired per-prompt ratios" in proc.stdout


def test_separate_pairing_times_the_baseline_alone_and_reports_unpaired(tmp_path):
    """The baseline's file already holds greedy's lines from an interleaved run of another method: a separate run
    times greedy alone all the same (those lines were timed in other rounds), once; a re-run resumes."""
    records = tmp_path / "records"
    run_cli("method=lookahead", "data.limit=2", "data.max_new_tokens=8", records_dir=records)
    assert {r["pairing"]["mode"] for r in load(records, "greedy")} == {"interleaved"}
    proc = run_cli("method=speculative", "runner.pairing=separate", "data.limit=2", "data.max_new_tokens=8",
                   records_dir=records)
    assert "unpaired" in proc.stdout
    assert {r["pairing"]["mode"] for r in load(records, "speculative")} == {"separate"}
    greedy = load(records, "greedy")
    assert [r["pairing"]["mode"] for r in greedy] == ["interleaved"] * 2 + ["separate"] * 2
    summary = json.loads(next(records.rglob("speculative-*.summary.json")).read_text())
    assert summary["paired"] is False and summary["identical"] == 2
    alone = [r for r in greedy if r["pairing"]["mode"] == "separate"]
    assert summary["baseline_tok_per_s"] == pytest.approx(sum(r["new_tokens"] for r in alone)
                                                         / sum(r["wall_s"] for r in alone))
    run_cli("method=speculative", "runner.pairing=separate", "data.limit=2", "data.max_new_tokens=8",
            records_dir=records)
    assert len(load(records, "greedy")) == 4 and len(load(records, "speculative")) == 2


def test_killed_interleaved_run_resumes_without_redoing_finished_pairs(tmp_path):
    records = tmp_path / "records"
    args = [sys.executable, "-m", "specbench", "model=tiny_llama", "method=speculative", "data.limit=12",
            "data.max_new_tokens=128", f"runner.records_dir={records}", f"hydra.run.dir={tmp_path / 'hydra'}",
            "runner.progress=false"]
    proc = subprocess.Popen(args, cwd=ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)

    def two_pairs_written():
        files = list(records.rglob("speculative-*.jsonl"))
        return bool(files) and len(files[0].read_text().splitlines()) >= 2

    wait_for(two_pairs_written, proc, "two pairs written")
    proc.send_signal(signal.SIGKILL)
    proc.wait(timeout=generous(30))
    kept = load(records, "speculative")
    assert 2 <= len(kept) < 12, "the run must be cut mid-way for this test to mean anything"
    run_cli("method=speculative", "data.limit=12", "data.max_new_tokens=128", records_dir=records)
    final = load(records, "speculative")
    assert final[:len(kept)] == kept and len({r["prompt_id"] for r in final}) == len(final) == 12
    greedy_rounds = {g["pairing"]["round"] for g in load(records, "greedy")}
    assert {r["pairing"]["round"] for r in final} <= greedy_rounds
    assert len(greedy_rounds) <= 13  # at most one orphan: a baseline written just before the kill


def test_expanded_interval_is_wider_than_the_plain_percentile_one_for_few_prompts():
    import random
    import statistics

    values = [[1.10], [1.35], [1.22], [1.41]]
    low, high = bootstrap_mean_ci(values)
    rng = random.Random(0)
    plain = sorted(statistics.fmean(rng.choices([v[0] for v in values], k=4)) for _ in range(8000))
    assert high - low > 1.3 * (plain[int(0.975 * 7999)] - plain[int(0.025 * 7999)])
    many = [[1.0 + 0.01 * (i % 7)] for i in range(200)]  # large n: close to the plain interval
    low, high = bootstrap_mean_ci(many)
    assert 0 < high - low < 0.01


def test_resuming_a_run_measured_with_another_resolution_is_refused_before_loading(tmp_path):
    import os

    records = tmp_path / "records"
    run_cli("method=greedy", "data.limit=1", "data.max_new_tokens=4", records_dir=records,
            env={**os.environ, "OMP_NUM_THREADS": "1"})
    proc = run_cli("method=greedy", "data.limit=2", "data.max_new_tokens=4", records_dir=records, check=False,
                   env={**os.environ, "OMP_NUM_THREADS": "2"})
    assert proc.returncode == 2 and "runner.records_dir" in proc.stderr and "1 threads" in proc.stderr
    assert len(load(records, "greedy")) == 1, "nothing was added"


def test_one_round_with_several_baselines_checks_each_method_against_its_own(tmp_path):
    """make bench's rounds: every variant's greedy is a baseline in the same round, and each method's outputs are
    checked against its own variant's greedy (a bug planted on the static variant is caught there); greedy on
    another pair object (make bench's float32 copy) is timed in the round but makes no claim."""
    from specbench.backends.execution import resolve_execution
    from specbench.data import Example
    from specbench.engines.loops import LoopBackend
    from specbench.methods.greedy import Greedy
    from specbench.methods.speculative import SpeculativeDecoding
    from specbench.run.runner import Entry, Runner, RunSpec

    from .planted_bugs import ThirdTokenBug
    from .test_equivalence import pair_for

    eager = pair_for("llama", 0.05)
    static = eager.with_execution(resolve_execution("static", "cpu"))
    other = eager.with_execution(resolve_execution("eager", "cpu"))  # the same weights, another pair object
    methods = {"greedy": Greedy(eager, "greedy"), "speculative": SpeculativeDecoding(eager, "speculative", gamma=3),
               "greedy@static": Greedy(static, "greedy"), "bug@static": ThirdTokenBug(static, "bug"),
               "greedy@other": Greedy(other, "greedy")}
    baselines = [0, 0, 2, 2, 0]
    examples = [Example(id=f"p{i}", turns=[t]) for i, t in enumerate(["abcabcabcabd", "the cat sat on the mat"])]
    entries = [Entry(m, RunSpec(key="k", method=name, pair=eager.name, data="d", records_dir=tmp_path))
               for name, m in methods.items()]
    runner = Runner(LoopBackend(eager, 10, warmup=0, threads=1, exact=True), progress=False)
    measured = dict(zip(methods, runner.run(entries, examples, examples[0], baselines=baselines)))
    verdicts = {name: [r.lossless and r.lossless["verdict"] for r in recs] for name, recs in measured.items()}
    assert verdicts == {"greedy": [None, None], "speculative": ["identical", "identical"],
                        "greedy@static": [None, None], "bug@static": ["MISMATCH", "MISMATCH"],
                        "greedy@other": [None, None]}
    rounds = [{r.pairing["round"] for r in recs} for recs in measured.values()]
    assert all(ids == rounds[0] for ids in rounds) and len(rounds[0]) == 2  # one round per prompt, all in it
