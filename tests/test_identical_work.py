"""Speed-up and τ over identical work (specbench/analysis/identical_work.py) on hand-built records: every expected value
is worked out by hand beside it."""
import pytest

from specbench.analysis.identical_work import cell_flags, shared_work, step_clock
from specbench.analysis.metrics import compare
from specbench.records.schema import RunRecord, TurnRecord


def turn(ids, steps, wall, step_ms=None, forward_ms=None):
    return {"output_ids": list(ids), "new_tokens": len(ids), "wall_s": wall, "accept_lengths": list(steps),
            "step_ms": list(step_ms or []), "forward_ms": {"target": list(forward_ms)} if forward_ms else {}}


def record(pid, *turns, round_id=None):
    first = turns[0]
    row = {"prompt_id": pid, "pairing": {"round": round_id}, **first}
    if len(turns) > 1:
        row.update(output_ids=[i for t in turns for i in t["output_ids"]],
                   new_tokens=sum(t["new_tokens"] for t in turns),
                   wall_s=sum(t["wall_s"] for t in turns), turns=[TurnRecord.from_dict(t) for t in turns],
                   accept_lengths=[n for t in turns for n in t["accept_lengths"]])
    return RunRecord.from_dict(row)


def greedy_turn(ids, ms_per_token):
    return turn(ids, [1] * len(ids), ms_per_token * len(ids) / 1000,
                step_ms=[ms_per_token * (i + 1) for i in range(len(ids))])


def test_identical_outputs_compare_whole_wall_times():
    mine = record("p", turn(range(12), [3, 3, 3, 3], 0.04, step_ms=[10, 20, 30, 40]))
    theirs = record("p", greedy_turn(range(12), 5))  # 60 ms
    work = shared_work(mine, theirs)
    assert (work.tokens, work.steps, work.step_tokens, work.clock) == (12, 4, 12, "whole")
    assert work.speedup == pytest.approx(0.06 / 0.04)  # 1.5
    assert (work.decoding_tokens, work.decoding_steps) == (9, 3)  # the first step (3 tokens) left out
    assert not work.unlike


def test_a_divergence_compares_up_to_the_methods_last_step_boundary_before_it():
    # the method's steps end at tokens 3, 6, 9, 12; it leaves greedy's output at token 7 (index 7 differs): the last
    # boundary within the 7 shared tokens is 6, reached after 20 ms; greedy's 6th token after 6 x 5 = 30 ms
    mine = record("p", turn([*range(7), 99, 98, 97, 96, 95], [3, 3, 3, 3], 0.04, step_ms=[10, 20, 30, 40]))
    theirs = record("p", greedy_turn(range(10), 5))
    work = shared_work(mine, theirs)
    assert (work.tokens, work.shared_prefix, work.steps, work.clock) == (6, 7, 2, "steps")
    assert (work.method_s, work.greedy_s) == (pytest.approx(0.020), pytest.approx(0.030))
    assert work.speedup == pytest.approx(1.5)
    assert (work.method_tokens, work.greedy_tokens) == (12, 10)


def test_a_divergence_inside_the_first_step_leaves_nothing_to_compare():
    mine = record("p", turn([0, 1, 99, 98], [4], 0.01, step_ms=[10]))
    work = shared_work(mine, record("p", greedy_turn(range(4), 5)))
    assert work.tokens == 0 and work.speedup is None and work.shared_prefix == 2


def test_greedy_stopping_early_is_compared_over_its_tokens_and_flagged():
    """Spec-Bench zen5 RAG prompt 523's shape: greedy answers in 7 tokens, the method goes on to 20 after leaving
    greedy's text at token 6; a whole-output ratio would credit the method with 20 tokens of prefill amortisation."""
    mine = record("p", turn([*range(6), *range(50, 64)], [2] * 10, 0.2, step_ms=[20 * (i + 1) for i in range(10)]))
    theirs = record("p", greedy_turn([*range(6), 2], 20))  # 7 tokens, 140 ms
    work = shared_work(mine, theirs)
    assert (work.tokens, work.method_s, work.greedy_s) == (6, pytest.approx(0.06), pytest.approx(0.12))
    assert work.speedup == pytest.approx(2.0)
    whole = (20 / 0.2) / (7 / 0.14)
    assert whole == pytest.approx(2.0)  # the same here by construction; the flag is about the lengths
    assert work.unlike  # 20 / 7 > 1.5
    flags = cell_flags([work])
    assert flags["flagged"] and flags["length_ratio"] == pytest.approx(20 / 7)
    assert flags["shared_fraction"] == pytest.approx(6 / 7)


def test_the_clock_is_estimated_from_per_forward_times_where_steps_were_not_read():
    t = TurnRecord.from_dict(turn(range(8), [2, 2, 2, 2], 0.3, forward_ms=[100, 50, 50, 50]))
    clock, kind = step_clock(t)
    # the rest (300 - 250 ms) spread evenly over the 4 steps: 12.5 ms each
    assert kind == "forwards" and clock == pytest.approx([112.5, 175, 237.5, 300])
    assert step_clock(TurnRecord.from_dict(turn(range(8), [2, 2, 2, 2], 0.3))) == (None, "missing")


def test_a_later_turn_counts_only_after_whole_identical_turns():
    first_m, first_g = turn(range(4), [2, 2], 0.02, step_ms=[10, 20]), greedy_turn(range(4), 10)  # 40 ms
    second_m = turn([10, 11, 12, 99], [2, 2], 0.02, step_ms=[10, 20])
    second_g = greedy_turn([10, 11, 12, 13], 10)
    work = shared_work(record("p", first_m, second_m), record("p", first_g, second_g))
    # turn 1 whole (4 tokens, 20 ms vs 40 ms), turn 2 up to the boundary at 2 (10 ms vs 20 ms)
    assert (work.tokens, work.method_s, work.greedy_s) == (6, pytest.approx(0.03), pytest.approx(0.06))
    assert (work.steps, work.decoding_steps, work.decoding_tokens) == (3, 1, 2)
    # without a clock for the diverged turn, the identical first turn is all that is compared
    unclocked = record("p", first_m, {**second_m, "step_ms": []})
    work = shared_work(unclocked, record("p", first_g, second_g))
    assert (work.tokens, work.clock) == (4, "missing") and work.speedup == pytest.approx(2.0)


def test_compare_reports_identical_work_beside_the_whole_output_figures():
    # p1 identical (ratio 1.5); p2 leaves greedy's text at token 7 and goes on to 24 tokens, fast once it is off
    m1 = record("p1", turn(range(12), [3, 3, 3, 3], 0.04, step_ms=[10, 20, 30, 40]), round_id="a")
    g1 = record("p1", greedy_turn(range(12), 5), round_id="a")
    m2 = record("p2", turn([*range(7), *range(80, 97)], [3] * 8, 0.04, step_ms=[10, 20, 25, 30, 32, 35, 38, 40]),
                round_id="b")
    g2 = record("p2", greedy_turn(range(10), 5), round_id="b")
    s = compare([m1, m2], [g1, g2])
    # p2 over identical work: boundary 6 at 20 ms vs greedy's 30 ms -> 1.5; mean with p1's 1.5 -> 1.5
    assert s["speedup"] == pytest.approx(1.5)
    # whole: p1 1.5, p2 (24 / 0.04) / (10 / 0.05) = 3.0 -> 2.25 too; Σ/Σ (36 / 0.08) / (22 / 0.11) = 2.25
    assert s["speedup_whole"] == pytest.approx(2.25) and s["speedup_total"] == pytest.approx(2.25)
    # τ over identical work, pooled: (12 + 6) / (4 + 2) = 3; whole outputs (12 + 24) / (4 + 8) = 3
    assert s["tau"] == pytest.approx(3.0) and s["tau_prompt_mean"] == pytest.approx(3.0)
    work = s["identical_work"]
    assert (work["tokens"], work["compared"], work["prompts"]) == (18, 2, 2)
    assert work["length_ratio"] == pytest.approx(36 / 22) and work["flagged"]  # 1.64 > 1.5
    assert s["identical_work_prompts"]["p2"]["unlike"] and not s["identical_work_prompts"]["p1"]["unlike"]
    sampled = compare([m1, m2], [g1, g2], exact=False)  # sampled outputs are not compared: whole outputs
    assert "identical_work" not in sampled and sampled["speedup"] == pytest.approx(2.25)
