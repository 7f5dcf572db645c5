"""``make bench`` on the tiny pair: every method in every round, the cost table, bounds and efficiencies."""
import json

from specbench import costs
from specbench.bench import main


def test_bench_rounds_cost_table_and_efficiency(tmp_path, capsys):
    result = main(["--model", "tiny_llama", "--data", "gsm8k", "--limit", "2", "--max-new-tokens", "12",
                   "--methods", "greedy,speculative,lookahead", "--fp32", "--cost-repeats", "1",
                   "--out", str(tmp_path)])
    out = capsys.readouterr().out
    assert "T(k)/T(1)" in out and "efficiency" in out
    assert set(result["efficiency"]) == {"speculative", "lookahead", "greedy_fp32"}
    spec = result["efficiency"]["speculative"]
    assert spec["bound"] > 0 and abs(spec["efficiency"] - spec["speedup_total"] / spec["bound"]) < 1e-9
    assert len(spec["speedup_ci95"]) == 2
    assert sorted(result["forward_ms"]["target"]) == sorted(costs.TABLE_SIZES + costs.EXTRA_SIZES)
    (run,) = tmp_path.iterdir()
    rounds = {}
    for path in run.rglob("*.jsonl"):
        for line in path.read_text().splitlines():
            r = json.loads(line)
            rounds.setdefault(r["pairing"]["round"], set()).add(r["method"])
    # one round per prompt, every method in it (the fp32 greedy included)
    assert len(rounds) == 2 and all(m == {"greedy", "speculative", "lookahead", "greedy_fp32"} for m in rounds.values())


def test_bound_is_predicted_greedy_time_over_predicted_method_time():
    table = {1: 10.0, 2: 12.0, 4: 14.0, 8: 20.0}
    assert costs.interpolate(table, 3) == 13.0 and costs.interpolate(table, 16) == 32.0
    greedy = [{"forward_sizes": {"target": [8] + [1] * 9}}]
    spec = [{"forward_sizes": {"target": [8, 4, 4], "draft": [8, 1, 1, 1, 1, 1, 1]}}]
    expected = (20 + 9 * 10) / ((20 + 14 + 14) + (20 + 6 * 10))
    assert abs(costs.bound(spec, greedy, table, table) - expected) < 1e-12
