"""``make bench`` on the tiny pair: every method in every round, the cost table, bounds and efficiencies;
``python -m specbench.bench``'s keys, help and errors."""
import json
import subprocess

import pytest
from hydra import compose, initialize_config_dir

from specbench.analysis import costs
from specbench import bench
from specbench.records.schema import RunRecord

from .conftest import ROOT
from .forked import run_module
from .limits import generous


def bench_config(*overrides: str):
    with initialize_config_dir(config_dir=str(ROOT / "conf"), version_base="1.3"):
        return compose(config_name="bench", overrides=list(overrides))


def bench_cli(*args: str, tmp_path) -> subprocess.CompletedProcess:
    return run_module("specbench.bench", f"paths.root={tmp_path / 'runs'}", *args, timeout=generous(120))


def test_bench_rounds_cost_table_and_efficiency(tmp_path, capsys):
    result = bench.run(bench_config("model=tiny_llama", "datasets=[gsm8k]", "limit=2", "max_new_tokens=12",
                              "methods=[greedy,speculative,lookahead]", "fp32=true", "cost_repeats=1",
                              f"out={tmp_path}"))
    out = capsys.readouterr().out
    assert "T(k)/T(1)" in out and "efficiency" in out
    assert set(result["efficiency"]) == {"speculative", "lookahead", "greedy_fp32"}
    spec = result["efficiency"]["speculative"]
    assert spec["bound"] > 0 and abs(spec["efficiency"] - spec["speedup_total"] / spec["bound"]) < 1e-9
    assert len(spec["speedup_ci95"]) == 2
    assert sorted(result["forward_ms"]["target"]["one_row_ms"]) == sorted(costs.TABLE_SIZES + costs.EXTRA_SIZES)
    assert result["forward_ms"]["target"]["row_ms"] >= 0
    (run,) = tmp_path.iterdir()
    rounds = {}
    for path in run.rglob("*.jsonl"):
        for line in path.read_text().splitlines():
            r = json.loads(line)
            rounds.setdefault(r["pairing"]["round"], set()).add(r["method"])
    # one round per prompt, every method in it (the fp32 greedy included)
    assert len(rounds) == 2 and all(m == {"greedy", "speculative", "lookahead", "greedy_fp32"} for m in rounds.values())


def test_bench_runs_both_backends_side_by_side_and_times_llamacpps_own_greedy(tmp_path, capsys):
    """model=tiny_gguf: the same weights on transformers and llama.cpp; every method against its own backend's
    greedy in the same rounds, a cost table per backend, and our greedy loop against llama.cpp's own."""
    pytest.importorskip("llama_cpp")
    result = bench.run(bench_config("model=tiny_gguf", "backends=[transformers,llamacpp]", "datasets=[gsm8k]",
                                    "limit=2", "max_new_tokens=12", "methods=[greedy,speculative,hf_assisted]",
                                    "cost_repeats=1", f"out={tmp_path}"))
    out = capsys.readouterr().out
    assert set(result["efficiency"]) == {"speculative@transformers", "hf_assisted@transformers",
                                         "speculative@llamacpp"}  # hf_assisted is refused on llama.cpp: left out
    assert set(result["forward_ms"]) == {"transformers", "llamacpp"}
    assert result["backends"]["llamacpp"]["gguf"]["quantization"] == "F32"
    native = result["greedy_vs_llamacpp"]["llamacpp"]
    assert native["same_tokens"] and native["ratio"] > 0 and "llama.cpp's own" in out
    summaries = result["summaries"]
    assert summaries["speculative@llamacpp"]["identical"] == summaries["speculative@llamacpp"]["compared"] == 2


def test_bound_is_predicted_greedy_time_over_predicted_method_time():
    table = {1: 10.0, 2: 12.0, 4: 14.0, 8: 20.0}
    assert costs.interpolate(table, 3) == 13.0 and costs.interpolate(table, 16) == 32.0
    greedy = [RunRecord(forward_sizes={"target": [8] + [1] * 9})]
    spec = [RunRecord(forward_sizes={"target": [8, 4, 4], "draft": [8, 1, 1, 1, 1, 1, 1]})]
    expected = (20 + 9 * 10) / ((20 + 14 + 14) + (20 + 6 * 10))
    assert abs(costs.bound(spec, greedy, table, table) - expected) < 1e-12


def test_bound_is_in_tokens_per_second_like_the_speed_up_when_the_outputs_differ_in_length():
    """A near-tie flipped (bf16, GGUF) and the method stopped at 80 tokens where greedy ran 128, after the same long
    prefill: the measured speed-up is a ratio of tok/s (metrics.rate), so its bound must be one too. As a ratio of
    predicted times it was 0.67 where the forwards allow 0.42, and the method's efficiency read 0.63 instead of 1."""
    table = {1: 30.0, 19: 200.0, 1300: 8000.0}
    greedy = RunRecord(new_tokens=128, forward_sizes={"target": [1300] + [1] * 127})
    method = RunRecord(new_tokens=80, forward_sizes={"target": [1300] + [19] * 20})
    greedy_ms, method_ms = 8000 + 127 * 30, 8000 + 20 * 200
    assert costs.bound([method], [greedy], table, None) == pytest.approx((80 / method_ms) / (128 / greedy_ms))
    same = RunRecord(new_tokens=128, forward_sizes=method.forward_sizes)
    assert costs.bound([same], [greedy], table, None) == pytest.approx(greedy_ms / method_ms)  # equal outputs: times


def test_extrapolation_past_the_table_uses_a_wide_span_not_the_last_two_sizes():
    """Ouroboros' draft feeds 25-50 tokens; a table measured at 31 and 32 with noise (T(31) > T(32)) once
    extrapolated T(47) below zero, which made the printed bound 0.52 where the forwards allowed 0.43."""
    table = {1: 38.0, 24: 250.0, 31: 342.0, 32: 312.0}
    slope = (312.0 - 250.0) / (32 - 24)  # 24 is the measured size nearest 32 / 2 = 16
    assert costs.interpolate(table, 47) == 312.0 + 15 * slope
    assert costs.interpolate({1: 10.0, 2: 30.0, 4: 20.0}, 8) == 20.0  # never below T(largest)
    assert costs.interpolate({5: 7.0}, 9) == 7.0


def test_each_forward_is_priced_with_the_rows_of_logits_it_kept():
    """A prefill keeps one row of logits, a verify block all of them: ForwardCosts prices the difference
    (Ouroboros' 40-token draft blocks keep every row; timed keeping one they looked ~25% too cheap)."""
    table = costs.ForwardCosts({1: 10.0, 8: 20.0}, row_ms=0.5)
    assert table.at(8, 1) == 20.0 and table.at(8) == table.at(8, 8) == 20.0 + 7 * 0.5 and table.at(1) == 10.0
    kept = [RunRecord(forward_sizes={"target": [8, 8]}, forward_rows={"target": [1, 8]})]
    assert costs.predicted_ms(kept, table, None) == 20.0 + 23.5
    unknown = [RunRecord(forward_sizes={"target": [8, 8]})]  # rows not recorded (hf_assisted): all rows
    assert costs.predicted_ms(unknown, table, None) == 2 * 23.5


def test_cached_lms_record_the_rows_of_logits_each_forward_computed(tiny_llama):
    from specbench.backends.torch.cached_lm import CachedLM
    from specbench.methods.greedy import Greedy

    lm = CachedLM(tiny_llama.target)
    lm.forward([5, 6, 7, 8], keep_last=1)
    lm.forward([9, 10, 11], parents=[-1, 0, 0], keep_last=2)
    lm.forward([12])
    assert lm.sizes == [4, 3, 1] and lm.rows == [1, 2, 1]
    gen = Greedy(tiny_llama, "greedy").generate([5, 6, 7, 8], 5, set())
    assert gen.forward_rows["target"] == [1] * gen.target_forwards


def test_measured_row_cost_is_the_difference_of_all_rows_and_one():
    class Clock:  # a fake model: 1 ms per token fed, 0.25 ms per row of logits kept
        device, length, now = None, 0, 0.0

        def forward(self, ids, keep_last=None):
            Clock.now += len(ids) + 0.25 * (keep_last or len(ids))
            self.length += len(ids)

        def crop(self, n):
            self.length = n

    import specbench.analysis.costs as module
    real = module.Stopwatch
    module.Stopwatch = lambda device: type("W", (), {"start": lambda s: setattr(s, "t", Clock.now),
                                                     "stop": lambda s: (Clock.now - s.t) / 1000})()
    try:
        measured = costs.measure_forward_costs(Clock(), [1, 2, 3], sizes={1, 4}, repeats=1, probe=8)
    finally:
        module.Stopwatch = real
    assert measured.ms == {1: 1.25, 4: 4.25, 8: 8.25} and measured.row_ms == 0.25
    assert measured.rows_ms == {2: 0.25, 3: 0.5, 5: 1.0, 8: 1.75}  # ROW_COUNTS below the probe, and the probe's all


def test_rows_of_logits_are_priced_on_the_measured_curve_not_a_straight_line():
    """On llama.cpp the 2nd..5th rows of logits cost ~3 ms each and rows 20..32 ~1.1 ms (one row is a matrix-vector
    product, several a matrix product): the 32-row average priced a 5-token verify's 4 extra rows at 4.4 ms where
    they cost 12."""
    curve = costs.ForwardCosts({1: 30.0, 5: 72.0, 32: 200.0}, row_ms=1.2, rows_ms={2: 3.0, 5: 12.0, 32: 37.0})
    assert curve.at(5) == 72.0 + 12.0 and curve.at(5, 1) == 72.0 and curve.at(1) == 30.0
    assert curve.at(32, 20) == pytest.approx(200.0 + 12.0 + (37.0 - 12.0) * 15 / 27)  # between the measured counts
    line = costs.ForwardCosts({1: 30.0, 5: 72.0}, row_ms=1.2)  # a summary written before the curve: as it was
    assert line.at(5) == pytest.approx(72.0 + 4 * 1.2)
    stored = {"target_ms": {"1": 30.0, "5": 72.0}, "target_row_ms": 1.2, "target_rows_ms": {"2": 3.0, "5": 12.0}}
    assert costs.stored_costs(stored, "target").at(5) == 84.0


def test_bench_keys_default_to_the_old_options_and_paths():
    cfg = bench_config()
    assert list(cfg.datasets) == ["gsm8k", "humaneval"]
    assert list(cfg.methods) == ["greedy", "speculative", "hf_assisted", "lookahead", "ouroboros"]
    assert (cfg.limit, cfg.max_new_tokens, cfg.gamma, cfg.fp32, cfg.cost_repeats, cfg.warmup, cfg.threads) == \
        (2, 128, 4, False, 3, 1, None)
    assert cfg.model.name == "qwen2.5-coder-1.5b-0.5b" and cfg.out == "runs/bench"
    assert bench_config("paths.root=/x").out == "/x/bench" and bench_config("out=/y").out == "/y"


@pytest.mark.parametrize("args, message", [
    (["limit=0"], "limit: must be a positive integer, got 0"),
    (["methods=[greedy,nosuch]"], "methods: 'nosuch' is not a conf/method option"),
    (["model=tiny_llama", "model.dtype=half"], "model.dtype: unknown dtype 'half'"),
    (["limt=3"], "Could not override 'limt'"),
    (["backends=[onnx]"], "backends: must be a list of ['auto', 'transformers', 'llamacpp']"),
    (["model=tiny_llama", "backends=[llamacpp]"], "model.backend: llamacpp runs GGUF files"),
    (["model=nosuch"], "Could not find 'model/nosuch'; Available options in 'model': "),
    (["model=tiny_llama", "threads=999"], "threads: 999 threads, but this process may use "),
    (["model=tiny_llama", "oversubscribe=1"], "oversubscribe: must be true or false, got 1"),
])
def test_bench_bad_input_is_one_line_naming_the_key_and_exit_2(tmp_path, args, message):
    proc = bench_cli(*args, tmp_path=tmp_path)
    assert proc.returncode == 2, proc.stderr
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("specbench.bench: error: ") and message in lines[0], proc.stderr
    assert not (tmp_path / "runs" / "bench").exists()


def test_bench_help_lists_its_keys(tmp_path):
    proc = bench_cli("--help", tmp_path=tmp_path)
    assert proc.returncode == 0
    for key in ("model=PAIR", "datasets=[A,B]", "methods=", "limit=N", "max_new_tokens=N", "gamma=N", "fp32=true",
                "cost_repeats=N", "warmup=N", "threads=N", "out=DIR", "paths.root=DIR"):
        assert key in proc.stdout, key
