"""Each forward's wall time is recorded where a forward has finished when it returns (``forward_ms``: the CPU,
llama.cpp), so an efficiency below 1 splits into forwards that ran slower in the loop than their cost table and
the method's own host work between forwards (costs.forward_split). Before, a category reading 0.51 (one prompt
whose decode took 2.6x its priced forwards) could not say which."""
from __future__ import annotations

import pytest
import torch

from specbench.analysis import costs
from specbench.methods.greedy import Greedy
from specbench.methods.speculative import SpeculativeDecoding
from specbench.analysis.console import render_headline
from specbench.records.schema import RunRecord, TurnRecord, combine_turns
from specbench.timing import ForwardClock

from .test_feature_heads import tiny_pair

TABLE = costs.ForwardCosts({1: 10.0, 4: 20.0})


def timed(prompt_id, sizes, ms, wall_s, tokens=4):
    return RunRecord(prompt_id=prompt_id, new_tokens=tokens, wall_s=wall_s, forward_sizes={"target": sizes},
                     forward_ms={"target": ms})


def test_the_split_multiplies_to_the_efficiency_and_names_the_slow_factor():
    # greedy: 4 one-token forwards at the table's 10 ms, 50 ms of wall time (forwards fill 80%)
    greedy = [timed("p", [1, 1, 1, 1], [10.0] * 4, 0.050)]
    # the method: two 4-token verifies the table prices at 20 ms that ran at 25 ms, and 30 ms more on the host
    method = [timed("p", [4, 4], [25.0, 25.0], 0.080)]
    split = costs.forward_split(method, greedy, TABLE, None)
    assert split["forwards"] == pytest.approx(1.0 / 1.25)  # its forwards ran at 1.25x the table, greedy's at 1x
    assert split["host"] == pytest.approx((50 / 80) / (40 / 50))  # forwards are 62.5% of its wall, 80% of greedy's
    speedup_total = (4 / 0.080) / (4 / 0.050)
    efficiency = speedup_total / costs.bound(method, greedy, TABLE, None)
    assert split["forwards"] * split["host"] == pytest.approx(efficiency)


def test_no_split_without_times_for_every_forward():
    greedy = [timed("p", [1, 1], [10.0, 10.0], 0.03)]
    untimed = [RunRecord(prompt_id="p", new_tokens=2, wall_s=0.03, forward_sizes={"target": [2]})]  # a GPU, vLLM
    assert costs.forward_split(untimed, greedy, TABLE, None) is None
    partly = [timed("p", [1, 1], [10.0], 0.03)]
    assert costs.forward_split(partly, greedy, TABLE, None) is None


def test_the_clock_keeps_nothing_on_a_gpu():
    clock = ForwardClock(torch.device("cuda"))  # a reading per forward there would need a synchronize
    clock.start()
    clock.stop()
    assert clock.ms == []
    cpu = ForwardClock(torch.device("cpu"))
    cpu.start()
    cpu.stop()
    assert len(cpu.ms) == 1 and cpu.ms[0] >= 0


@pytest.mark.parametrize("name", ["greedy", "speculative"])
def test_every_forward_of_a_generation_is_timed_and_the_times_travel_with_the_record(name):
    pair = tiny_pair()
    prompt = [3, 17, 29, 5, 41, 8, 12, 3, 17, 29]
    method = Greedy(pair, "greedy") if name == "greedy" else SpeculativeDecoding(pair, "speculative", gamma=3)
    gen = method.generate(prompt, 16, set())
    for role, sizes in gen.forward_sizes.items():
        assert len(gen.forward_ms[role]) == len(sizes) and all(ms > 0 for ms in gen.forward_ms[role]), role
    turns = [TurnRecord(forward_sizes=gen.forward_sizes, forward_ms=gen.forward_ms)] * 2
    assert combine_turns(turns).forward_ms["target"] == gen.forward_ms["target"] * 2
    line = RunRecord(prompt_id="p", forward_sizes=gen.forward_sizes, forward_ms=gen.forward_ms)
    assert RunRecord.from_dict(line.to_dict()).forward_ms == gen.forward_ms
    assert "forward_ms" not in RunRecord(prompt_id="p").to_dict()
    again = method.generate(prompt, 4, set())  # a new generation starts a new list
    assert len(again.forward_ms["target"]) == again.target_forwards


def test_run_bound_and_the_headline_carry_the_split():
    pair = tiny_pair()
    prompt = [3, 17, 29, 5, 41, 8, 12, 3, 17, 29]

    def record(method):
        gen = method.generate(prompt, 12, set())
        return RunRecord(prompt_id="p", new_tokens=len(gen.tokens), wall_s=sum(map(sum, gen.forward_ms.values())) / 500,
                         forward_sizes=gen.forward_sizes, forward_rows=gen.forward_rows, forward_ms=gen.forward_ms)

    run, base = [record(SpeculativeDecoding(pair, "speculative", gamma=3))], [record(Greedy(pair, "greedy"))]
    priced = costs.run_bound(pair, run, base, prompt, repeats=1)
    split = priced["split"]
    assert split["method"]["forward_share"] == pytest.approx(0.5) and split["host"] == pytest.approx(1.0)
    assert split["forwards"] == pytest.approx(split["baseline"]["vs_table"] / split["method"]["vs_table"])
    text = render_headline("speculative", {"speedup": 0.9, "bound": {**priced, "efficiency": 0.9}})
    assert f"= forwards {split['forwards']:.2f}" in text and "host work 1.00" in text


def test_a_report_row_carries_both_factors():
    from specbench.report.paper import bound_values

    values = bound_values({"bound": 0.5, "efficiency": 0.8, "split": {"forwards": 0.9, "host": 0.88}})
    assert values["forward_efficiency"] == 0.9 and values["host_efficiency"] == 0.88
    assert bound_values({"bound": 0.5, "efficiency": 0.8})["forward_efficiency"] is None  # records without times
