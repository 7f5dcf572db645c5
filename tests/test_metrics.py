"""specbench/analysis/metrics.py against hand computations on small hand-built record lists, and the console rendering
of the numbers it derives (identity "k/n", speed-up text, headline).

Every expected value below is worked out by hand in the comment beside it; none is recomputed with the code
under test.
"""
import math
import random
import statistics

import pytest
from scipy.stats import t as student_t

from specbench.analysis.metrics import (acceptance_rate, bootstrap_mean_ci, by_prompt, compare, first_divergence,
                                        first_repeat, fmt, losslessness, matched_baseline, mean_sl, one_per_prompt,
                                        partners_of, rate, reference_of, summarize, t_975, tau, tau_decoding,
                                        verdict_of)
from specbench.records.schema import RunRecord, TurnRecord
from specbench.analysis.console import identity_text, render_headline, render_table, speedup_text

GREEDY_IDS = (1, 2, 3)


def rec(pid, tokens, wall, *, repeat=0, round_id=None, ids=GREEDY_IDS, **extra):
    """One record: only the fields analysis/metrics.py reads."""
    record = {"prompt_id": pid, "repeat": repeat, "new_tokens": tokens, "wall_s": wall, "output_ids": list(ids),
              "pairing": {"round": round_id}}
    record.update(extra)
    return RunRecord.from_dict(record)


# -- rates, τ, acceptance, SL ---------------------------------------------------------------------------------------

def test_rate_is_total_tokens_over_total_time_not_the_mean_of_rates():
    # 10 tok / 2 s = 5 tok/s and 30 tok / 3 s = 10 tok/s: Σ/Σ = 40 / 5 = 8.0 (the mean of rates would be 7.5)
    assert rate([rec("a", 10, 2.0), rec("b", 30, 3.0)]) == 8.0
    assert rate([rec("a", 7, 0.5)]) == 14.0
    assert rate([]) is None
    assert rate([rec("a", 5, 0.0)]) is None


def test_tau_pools_steps_over_records():
    # steps 3, 1 and 5: 9 tokens / 3 target forwards = 3.0 (the mean of per-record means would be (2 + 5) / 2 = 3.5)
    assert tau([rec("a", 4, 1.0, accept_lengths=[3, 1]), rec("b", 5, 1.0, accept_lengths=[5])]) == 3.0
    assert tau([rec("g", 7, 1.0, accept_lengths=[1] * 7)]) == 1.0  # greedy: one token per forward


def test_tau_over_decoding_steps_leaves_out_each_turns_prompt_reading_step():
    """Spec-Bench's #Mean Accepted Tokens: a 17-token answer in 7 steps is τ 17 / 7 = 2.43, 16 / 6 = 2.67 without
    the step that read the prompt; a two-turn record loses each turn's first step."""
    answer = rec("rag", 17, 1.0, accept_lengths=[1, 1, 1, 1, 2, 10, 1])
    assert tau([answer]) == pytest.approx(17 / 7) and tau_decoding([answer]) == pytest.approx(16 / 6)
    two_turns = rec("mt", 9, 1.0, accept_lengths=[1, 3, 1, 4])
    two_turns.turns = [TurnRecord(accept_lengths=[1, 3]), TurnRecord(accept_lengths=[1, 4])]
    assert tau_decoding([two_turns]) == 3.5 and tau_decoding([answer, two_turns]) == pytest.approx(23 / 8)
    assert tau_decoding([rec("one", 1, 1.0, accept_lengths=[1])]) is None  # no step after the prompt's
    assert tau_decoding([rec("a", 12, 1.0, target_forwards=4)]) is None  # no per-step counts (hf_assisted)


def test_tau_without_steps_is_new_tokens_over_target_forwards():
    # hf_assisted: (12 + 6) tokens / (4 + 1) forwards = 3.6 (the mean of ratios would be (3 + 6) / 2 = 4.5)
    records = [rec("a", 12, 1.0, target_forwards=4), rec("b", 6, 1.0, target_forwards=1)]
    assert tau(records) == pytest.approx(3.6, rel=1e-12)
    assert tau([rec("a", 4, 1.0, accept_lengths=[], target_forwards=2)]) == 2.0  # an empty list counts as absent
    assert tau([rec("a", 4, 1.0)]) is None  # neither steps nor forwards


def test_acceptance_rate_is_total_accepted_over_total_drafted():
    records = [rec("a", 9, 1.0, drafted=8, accepted=6), rec("b", 1, 1.0, drafted=4, accepted=0),
               rec("g", 5, 1.0)]  # a record without draft counters contributes nothing
    assert acceptance_rate(records) == 0.5  # (6 + 0) / (8 + 4); the mean of rates would be 0.375
    assert acceptance_rate([rec("g", 5, 1.0)]) is None
    assert acceptance_rate([rec("a", 1, 1.0, drafted=0, accepted=0)]) is None


def test_mean_sl_pools_steps_from_extra():
    records = [rec("a", 1, 1.0, extra={"sl": [4, 4, 2]}), rec("b", 1, 1.0, extra={"sl": [3]}), rec("c", 1, 1.0)]
    assert mean_sl(records) == 3.25  # 13 / 4
    assert mean_sl([rec("a", 1, 1.0), rec("b", 1, 1.0, extra={})]) is None


# -- divergence, grouping, the records a comparison uses ------------------------------------------------------------

@pytest.mark.parametrize("a, b, expected", [
    ([1, 2, 3], [1, 2, 3], None),
    ([1, 2, 3], [1, 5, 3], 1),
    ([7], [8], 0),
    ([1, 2], [1, 2, 3], 2),  # a common prefix, one longer: diverges where the shorter ends
    ([1, 2, 3], [1, 2], 2),
    ([], [4], 0),
    ([], [], None),
])
def test_first_divergence(a, b, expected):
    assert first_divergence(a, b) == expected


def test_by_prompt_groups_records_in_order():
    a0, b0, a1 = rec("a", 1, 1.0), rec("b", 1, 1.0), rec("a", 1, 1.0, repeat=1)
    groups = by_prompt([a0, b0, a1])
    assert list(groups) == ["a", "b"] and groups["a"] == [a0, a1] and groups["b"] == [b0]


def test_first_repeat_and_one_per_prompt_pick_the_same_first_stored_record():
    # a baseline file paired with two methods holds (p1, repeat 0) once per round
    p1_r2 = rec("p1", 1, 1.0, repeat=2, round_id="x")
    p1_r0_a = rec("p1", 1, 1.0, repeat=0, round_id="a")
    p1_r1 = rec("p1", 1, 1.0, repeat=1, round_id="y")
    p2_r0 = rec("p2", 1, 1.0, repeat=0, round_id="z")
    p1_r0_b = rec("p1", 1, 1.0, repeat=0, round_id="b")
    records = [p1_r2, p1_r0_a, p1_r1, p2_r0, p1_r0_b]
    assert first_repeat(records, "p1") is p1_r0_a
    assert first_repeat(records, "p2") is p2_r0
    assert first_repeat(records, "nope") is None
    kept = one_per_prompt(records)
    assert kept == [p1_r2, p1_r0_a, p1_r1, p2_r0] and kept[1] is p1_r0_a  # the round-b duplicate dropped
    assert one_per_prompt([]) == []


def test_partners_and_matched_baseline():
    m1, m2, m_sep = rec("p1", 1, 1.0, round_id="r1"), rec("p2", 1, 1.0, round_id="r2"), rec("p3", 1, 1.0)
    b1, b2, b9, b_sep = (rec("p1", 1, 1.0, round_id="r1"), rec("p2", 1, 1.0, round_id="r2"),
                         rec("p1", 1, 1.0, round_id="r9"), rec("p3", 1, 1.0))
    baseline = [b9, b2, b_sep, b1]
    assert partners_of([m1, m2, m_sep], baseline) == {"r1": b1, "r2": b2}  # round None is never a partner
    assert matched_baseline([m2, m1, m_sep], baseline) == [b2, b1]  # in the records' order, unpaired left out
    assert matched_baseline([m_sep], baseline) == [b9, b2, b_sep]  # unpaired: one per (prompt, repeat)
    assert partners_of([m_sep], baseline) == {}


def test_reference_of_prefers_the_round_partner_then_the_first_repeat():
    base_r0 = rec("p1", 1, 1.0, round_id="other")
    base_round = rec("p1", 1, 1.0, repeat=1, round_id="mine")
    baseline = [base_r0, base_round]
    mine = rec("p1", 1, 1.0, repeat=1, round_id="mine")
    assert reference_of(mine, baseline, {"mine": base_round}) is base_round
    assert reference_of(mine, baseline, {}) is base_r0
    assert reference_of(mine, baseline, None) is base_r0
    assert reference_of(rec("p9", 1, 1.0), baseline, None) is None


@pytest.mark.parametrize("stored, ref_round, divergence, expected", [
    ({"verdict": "near-tie", "index": 3, "against": "r1"}, "r1", 3, "near-tie"),
    ({"verdict": "MISMATCH", "index": 0, "against": "r1"}, "r1", 0, "MISMATCH"),
    ({"verdict": "MISMATCH", "index": 0}, None, 0, "MISMATCH"),  # separate pairing: no round either side
    # check 4 names the row past the near-tie at 3 that left the noise: it stands, as agreement's does
    ({"verdict": "MISMATCH", "check": "continuation", "index": 40, "divergence": 3, "against": "r1"}, "r1", 3,
     "MISMATCH"),
    ({"verdict": "MISMATCH", "check": "divergence", "index": 40, "against": "r1"}, "r1", 3, "unclassified"),
    # the agreement check's MISMATCH stands against another greedy line too (identical ids: once an alone line
    # became the unpaired reference it read as identical)
    ({"verdict": "MISMATCH", "check": "agreement", "index": 7, "against": "r1"}, None, None, "MISMATCH"),
    ({"verdict": "MISMATCH", "check": "own_forward", "index": 7, "against": "r1"}, "r7", 3, "MISMATCH"),
    ({"verdict": "near-tie", "index": 3, "against": "r7"}, "r1", 3, "unclassified"),  # checked against another
    ({"verdict": "near-tie", "index": 2, "against": "r1"}, "r1", 3, "unclassified"),  # another position
    ({"verdict": "error", "reason": "boom", "against": "r1"}, "r1", 3, "unclassified"),
    ({"verdict": "identical", "against": "r1"}, "r1", 3, "unclassified"),  # the ids say otherwise
    (None, "r1", 3, "unclassified"),
])
def test_verdict_of(stored, ref_round, divergence, expected):
    record = rec("p", 1, 1.0, lossless=stored) if stored is not None else rec("p", 1, 1.0)
    assert verdict_of(record, rec("p", 1, 1.0, round_id=ref_round), divergence) == expected


def test_a_later_turns_verdict_counts_its_indices_over_the_concatenated_turns():
    """runner.classify_record: a continuation MISMATCH in turn 2 (near-tie at its token 1, a row beyond the noise at
    its token 3) names both places in the record's output_ids, past turn 1's 4 tokens."""
    from specbench.run.runner import classify_record

    class Check:
        def classify(self, prompt, greedy, method):
            if greedy.output_ids == method.output_ids:
                return {"verdict": "identical"}
            return {"verdict": "MISMATCH", "check": "continuation", "index": 3, "divergence": 1,
                    "continuation": {"index": 3, "ratio": 2.0}}

    turns = [TurnRecord(output_ids=[1, 2, 3, 4]), TurnRecord(output_ids=[5, 6, 7, 8])]
    diverged = [TurnRecord(output_ids=[1, 2, 3, 4]), TurnRecord(output_ids=[5, 9, 7, 8])]
    baseline = RunRecord(prompt_id="p", turns=turns, pairing={"round": "r1"})
    record = RunRecord(prompt_id="p", turns=diverged, pairing={"round": "r1"})
    verdict = classify_record(Check(), [[0], [0]], record, baseline)
    assert verdict["turn"] == 1 and verdict["against"] == "r1"
    assert (verdict["index"], verdict["divergence"], verdict["continuation"]["index"]) == (7, 5, 7)
    assert verdict_of(record.__class__(**{**vars(record), "lossless": verdict}), baseline, 5) == "MISMATCH"


# -- identity: "identical to greedy k/n" ----------------------------------------------------------------------------

def identity_case():
    """Five prompts, paired: p1 identical, p2 a near-tie at 2, p3 a MISMATCH at 0, p4 one token short (no verdict),
    p5 a round whose baseline line was lost. p1 also has a repeat that diverges (only the first repeat counts)."""
    method = [
        rec("p1", 3, 1.0, round_id="r1", ids=[1, 2, 3], lossless={"verdict": "identical", "against": "r1"}),
        rec("p2", 3, 1.0, round_id="r2", ids=[1, 2, 9], lossless={"verdict": "near-tie", "index": 2, "against": "r2"}),
        rec("p3", 3, 1.0, round_id="r3", ids=[4, 2, 3], lossless={"verdict": "MISMATCH", "index": 0, "against": "r3"}),
        rec("p4", 2, 1.0, round_id="r4", ids=[1, 2]),
        rec("p5", 3, 1.0, round_id="r5", ids=[5, 5, 5]),
        rec("p1", 3, 1.0, repeat=1, round_id="r1b", ids=[9, 9, 9]),
    ]
    baseline = [rec(f"p{i}", 3, 2.0, round_id=f"r{i}", ids=[1, 2, 3]) for i in (1, 2, 3, 4)]
    baseline.append(rec("p1", 3, 2.0, repeat=1, round_id="r1b", ids=[1, 2, 3]))
    return method, baseline


def test_losslessness_counts_each_prompt_once_and_classifies_divergences():
    method, baseline = identity_case()
    result = losslessness(method, baseline, partners_of(method, baseline))
    assert result == {
        "identical": 1, "compared": 4, "near_ties": 1, "mismatches": 1, "unclassified": 1,
        "first_divergence": {"p1": None, "p2": 2, "p3": 0, "p4": 2},
        "divergences": {"p2": "near-tie", "p3": "MISMATCH", "p4": "unclassified"},
    }


def test_identity_with_k_below_n_is_rendered_as_such():
    method, baseline = identity_case()
    s = summarize(method, baseline)
    assert (s["identical"], s["compared"]) == (1, 4)
    assert identity_text(s) == "1/4 (1 near-tie, 1 MISMATCH, 1 unclassified)"
    headline = render_headline("speculative", s)
    assert ("lossless: 2/4 (1 identical, 1 differs from one-row greedy only by kernel rounding); 1 MISMATCH: beyond "
            "the measured numerical noise, a bug (each record's `lossless` says where and why); 1 unclassified"
            in headline.splitlines())
    row = render_table([("speculative", s)]).splitlines()[2]
    assert "1/4 (1 near-tie, 1 MISMATCH, 1 unclassified)" in row


def test_identity_text_variants():
    assert identity_text({"identical": 3, "compared": 3, "near_ties": 0, "mismatches": 0, "unclassified": 0}) == "3/3"
    assert identity_text({"identical": 2, "compared": 4, "near_ties": 2}) == "2/4 (2 near-tie)"
    assert identity_text({"is_baseline": True}) == "(baseline)"
    assert identity_text({"identical": None, "compared": 0}) == "-"  # sampled: nothing compared


def test_headline_identity_plurals():
    base = {"tok_per_s": 1.0, "identical": 2, "compared": 4, "near_ties": 2, "mismatches": 0, "unclassified": 0,
            "largest_gap": {"gap": 0.16, "tolerance": 0.75}}
    assert ("lossless: 4/4 (2 identical, 2 differ from one-row greedy only by kernel rounding, largest gap 0.16 <= "
            "tolerance 0.75)") in render_headline("m", base).splitlines()
    one = {**base, "identical": 2, "compared": 4, "near_ties": 1, "mismatches": 1}
    assert ("lossless: 3/4 (2 identical, 1 differs from one-row greedy only by kernel rounding, largest gap 0.16 <= "
            "tolerance 0.75); 1 MISMATCH: beyond the measured numerical noise, a bug (each record's `lossless` says "
            "where and why)") in render_headline("m", one).splitlines()


def test_sampled_runs_are_not_compared():
    method, baseline = identity_case()
    s = summarize(method, baseline, exact=False)
    assert s["identical"] is None and s["compared"] == 0 and s["first_divergence"] == {}
    assert identity_text(s) == "-"
    assert "lossless" not in render_headline("m", s)


def test_all_identical_counts_n_of_n():
    method = [rec(f"p{i}", 3, 1.0, round_id=f"r{i}") for i in range(3)]
    baseline = [rec(f"p{i}", 3, 2.0, round_id=f"r{i}") for i in range(3)]
    s = compare(method, baseline)
    assert (s["identical"], s["compared"], s["near_ties"], s["mismatches"], s["unclassified"]) == (3, 3, 0, 0, 0)


# -- speed-up -------------------------------------------------------------------------------------------------------

def paired_case():
    """p1 with two repeats, p2 with one (unequal repeats: averaging per prompt first matters), every (prompt, repeat)
    its own round; p3's baseline line was lost; a round of another run (r9) sits in the baseline file."""
    method = [
        rec("p1", 10, 1.0, round_id="a"),             # 10 tok/s
        rec("p1", 10, 2.0, repeat=1, round_id="b"),   # 5
        rec("p2", 20, 2.0, round_id="c"),             # 10
        rec("p3", 30, 3.0, round_id="e"),             # no partner
    ]
    baseline = [
        rec("p1", 10, 2.0, round_id="a"),             # 5   -> ratio 2.0
        rec("p1", 10, 2.0, repeat=1, round_id="b"),   # 5   -> ratio 1.0
        rec("p2", 20, 5.0, round_id="c"),             # 4   -> ratio 2.5
        rec("p1", 10, 100.0, round_id="r9"),          # another run's round: ignored
    ]
    return method, baseline


def test_paired_speedup_by_hand():
    method, baseline = paired_case()
    s = compare(method, baseline)
    assert s["paired"] is True and s["pairs"] == 3 and s["unpaired_records"] == 1
    # per prompt (repeats averaged first): p1 (2.0 + 1.0) / 2 = 1.5, p2 2.5; mean 2.0 (the mean over the three
    # records would be 5.5 / 3)
    assert s["speedup"] == pytest.approx(2.0, rel=1e-12)
    assert s["speedup_prompt_mean"] == s["speedup"]
    # Σ/Σ over the same pairs: method 40 tok / 5 s = 8, baseline 40 tok / 9 s -> 9 / 5
    assert s["speedup_total"] == pytest.approx(1.8, rel=1e-12)
    # per repeat: repeat 0 (2.0 + 2.5) / 2 = 2.25, repeat 1 1.0; sample std = 1.25 / sqrt(2)
    assert s["speedup_std"] == pytest.approx(1.25 / math.sqrt(2), rel=1e-12)
    assert s["baseline_tok_per_s"] == pytest.approx(40 / 9, rel=1e-12) and s["baseline_prompts"] == 2
    # two prompts: the expanded interval's tail is ~1e-13, i.e. the extreme resample means: (1.5, 2.5)
    assert s["speedup_ci95"] == pytest.approx((1.5, 2.5), rel=1e-12)


def test_paired_speedup_rendering():
    method, baseline = paired_case()
    s = summarize(method, baseline)
    assert speedup_text(s) == "2.00x [1.50, 2.50]"
    lines = render_headline("speculative", s).splitlines()
    # identical outputs: identical work is the whole work (p1's first repeat 10 tokens, p2's 20)
    assert ("speedup vs greedy over identical work: 2.00x [1.50, 2.50] (mean of paired per-prompt ratios, 95% "
            "interval; over 30 of 30 tokens emitted alike)") in lines
    assert ("  whole outputs: 2.00x [1.50, 2.50]; Σtokens/Σtime 1.80x (3 pair(s); 1 record(s) without their baseline "
            "left out)") in lines


def test_paired_speedup_is_restricted_to_prompts_with_a_partner():
    method, baseline = paired_case()
    without_p3 = compare(method[:3], baseline)
    with_p3 = compare(method, baseline)
    for key in ("speedup", "speedup_total", "speedup_std", "speedup_ci95", "baseline_tok_per_s", "baseline_prompts"):
        assert with_p3[key] == without_p3[key], key
    assert without_p3["unpaired_records"] == 0


def unpaired_case():
    method = [rec("p1", 10, 1.0), rec("p1", 10, 2.0, repeat=1), rec("p2", 20, 2.0),
              rec("p3", 30, 1.0)]                            # p3: not in the baseline
    baseline = [rec("p1", 10, 2.0), rec("p2", 20, 4.0),
                rec("p4", 50, 1.0)]                          # p4: not in the method's records
    return method, baseline


def test_unpaired_speedup_by_hand_on_common_prompts():
    method, baseline = unpaired_case()
    s = compare(method, baseline)
    assert s["paired"] is False and s["speedup_ci95"] is None and s["baseline_prompts"] == 2
    # common prompts p1, p2. baseline: 30 tok / 6 s = 5.0 tok/s; method: 40 tok / 5 s = 8.0 tok/s
    assert s["baseline_tok_per_s"] == 5.0
    assert s["speedup"] == pytest.approx(1.6, rel=1e-12) and s["speedup_total"] == s["speedup"]
    # per prompt: p1 (20 / 3) / 5 = 4/3, p2 (20 / 2) / 5 = 2.0; mean 5/3
    assert s["speedup_prompt_mean"] == pytest.approx(5 / 3, rel=1e-12)
    # per repeat over common prompts: repeat 0 30 tok / 3 s = 10 -> 2.0, repeat 1 10 / 2 = 5 -> 1.0; std 1/sqrt(2)
    assert s["speedup_std"] == pytest.approx(1 / math.sqrt(2), rel=1e-12)
    assert (s["identical"], s["compared"]) == (2, 2)  # p3 has no reference
    assert speedup_text(s) == "1.60x ±0.71 unpaired"
    assert ("speedup vs greedy: 1.60x (unpaired: the baseline was timed separately; over 30 of 30 tokens emitted "
            "alike)") in render_headline("m", summarize(method, baseline)).splitlines()


def test_unpaired_identical_work_pairs_repeat_with_repeat_and_equals_the_whole_output_ratio():
    """Every output identical: over identical work the unpaired speed-up is the whole-output one. Greedy's second
    repeat (3 s) counts, not only its first (1 s): 2 prompts x 2 repeats at 0.5 s each against greedy's 1 s and 3 s
    is 4.0x either way (it read 2.0x when every repeat was compared with greedy's first)."""
    method = [rec(p, 10, 0.5, repeat=k) for p in ("p1", "p2") for k in (0, 1)]
    baseline = [rec(p, 10, wall, repeat=k) for p in ("p1", "p2") for k, wall in ((0, 1.0), (1, 3.0))]
    s = compare(method, baseline)
    assert s["speedup"] == pytest.approx(4.0) and s["speedup_whole"] == pytest.approx(4.0)
    assert s["speedup_total"] == pytest.approx(4.0)


def test_an_unpaired_comparison_reads_the_baseline_timed_alone_not_other_methods_rounds():
    """A baseline file holds its lines timed alone and one per round some other method paired in (here at 3 s): the
    report and the run compare an unpaired method with the same baseline, one record per (prompt, repeat), timed
    alone where there is one."""
    alone = [rec("p1", 10, 1.0), rec("p2", 10, 1.0)]
    rounds = [rec("p1", 10, 3.0, round_id="x"), rec("p2", 10, 3.0, round_id="y")]
    method = [rec("p1", 10, 0.5), rec("p2", 10, 0.5)]
    for stored in (alone + rounds, rounds[:1] + alone + rounds[1:]):
        assert one_per_prompt(stored) == alone and matched_baseline(method, stored) == alone
        assert first_repeat(stored, "p1") is alone[0]
        s = compare(method, stored)
        assert s["speedup_whole"] == pytest.approx(2.0) and s["baseline_tok_per_s"] == pytest.approx(10.0)
        assert s["speedup"] == pytest.approx(2.0)
    assert one_per_prompt(rounds[:1] + alone[1:]) == rounds[:1] + alone[1:]  # none alone for p1: its first stored
    assert compare(method, rounds)["baseline_tok_per_s"] == pytest.approx(10 / 3)


def test_no_common_prompt_gives_no_speedup():
    s = compare([rec("p1", 10, 1.0)], [rec("p2", 10, 1.0)])
    assert s["speedup"] is None and s["baseline_prompts"] == 0 and s["paired"] is False
    assert speedup_text(s) == "-"


# -- the summary row ------------------------------------------------------------------------------------------------

def summary_records():
    return [
        rec("p1", 10, 2.0, prefill_s=0.5, accept_lengths=[3, 3, 4], drafted=9, accepted=7, target_forwards=3,
            draft_forwards=9),
        rec("p2", 20, 2.0, prefill_s=0.3, accept_lengths=[5, 5, 5, 5], drafted=16, accepted=16, target_forwards=4,
            draft_forwards=16),
        rec("p1", 10, 4.0, repeat=1, accept_lengths=[4, 3, 3], drafted=9, accepted=7, target_forwards=3,
            draft_forwards=9),  # no prefill recorded
    ]


def test_summarize_by_hand():
    s = summarize(summary_records())
    assert s["prompts"] == 2 and s["repeats"] == 2
    assert s["new_tokens"] == 40 and s["wall_s"] == 8.0
    assert s["tok_per_s"] == 5.0                                              # 40 / 8
    # per repeat: repeat 0 30 tok / 4 s = 7.5, repeat 1 10 / 4 = 2.5; sample std = 5 / sqrt(2)
    assert s["tok_per_s_std"] == pytest.approx(5 / math.sqrt(2), rel=1e-12)
    assert s["tok_per_s_prompt_mean"] == pytest.approx((5 + 10 + 2.5) / 3, rel=1e-12)
    assert s["ms_per_token"] == 200.0                                         # 1000 * 8 / 40
    assert s["prefill_s_mean"] == pytest.approx(0.4, rel=1e-12)               # (0.5 + 0.3) / 2
    assert s["tau"] == 4.0                                                    # 40 tokens / 10 steps
    assert s["acceptance_rate"] == pytest.approx(30 / 34, rel=1e-12)
    assert s["target_forwards"] == 10 and s["draft_forwards"] == 34
    assert s["accuracy"] is None and s["speedup"] is None


def test_summarize_one_repeat_has_zero_std_and_baseline_flags():
    s = summarize(summary_records()[:2], is_baseline=True)
    assert s["repeats"] == 1 and s["tok_per_s_std"] == 0.0
    assert s["speedup"] == 1.0 and s["is_baseline"] is True and "compared" not in s
    assert identity_text(s) == "(baseline)"
    assert "speedup vs greedy: 1.00x (this run is the baseline)" in render_headline("greedy", s).splitlines()
    assert summarize([]) == {"prompts": 0}
    assert summarize(summary_records(), baseline=[])["speedup"] is None


def test_summarize_carries_compare():
    method, baseline = paired_case()
    s = summarize(method, baseline)
    assert s["speedup"] == pytest.approx(2.0, rel=1e-12) and s["pairs"] == 3 and s["prompts"] == 3


# -- the interval ---------------------------------------------------------------------------------------------------

def test_t_975_matches_student_t():
    for df in range(1, 31):  # the table, to its 3 decimals
        assert abs(t_975(df) - student_t.ppf(0.975, df)) < 6e-4, df
    for df in (31, 35, 50, 100, 1000):  # the Cornish-Fisher expansion
        assert abs(t_975(df) - student_t.ppf(0.975, df)) < 2e-4, df
    values = [t_975(df) for df in range(1, 200)]
    assert all(a > b for a, b in zip(values, values[1:]))  # decreasing, no jump at the table's end


def test_bootstrap_few_prompts_gives_the_range_of_their_means():
    # n = 2 or 4: the tail Φ(-sqrt(n/(n-1)) t_{n-1}) is below 1/8000, so the interval is the extreme resample
    # means, i.e. the smallest and largest unit (all-equal resamples occur 8000/4 and 8000/256 times on average)
    assert bootstrap_mean_ci([[1.0], [3.0]]) == pytest.approx((1.0, 3.0), rel=1e-12)
    assert bootstrap_mean_ci([[1.10], [1.35], [1.22], [1.41]]) == pytest.approx((1.10, 1.41), rel=1e-12)
    # repeats of a prompt are averaged first: units 2.0 and 5.0 (flattened it would be (1.0, 5.0))
    assert bootstrap_mean_ci([[1.0, 3.0], [5.0]]) == pytest.approx((2.0, 5.0), rel=1e-12)
    # one prompt with repeats: the repeats are resampled (n = 3)
    assert bootstrap_mean_ci([[1.0, 2.0, 4.0]]) == pytest.approx((1.0, 4.0), rel=1e-12)


def test_bootstrap_degenerate_inputs():
    assert bootstrap_mean_ci([[2.0]]) is None
    assert bootstrap_mean_ci([]) is None
    assert bootstrap_mean_ci([[]]) is None
    assert bootstrap_mean_ci([[2.0], []]) is None
    assert bootstrap_mean_ci([[1.5]] * 6) == (1.5, 1.5)


def test_bootstrap_is_seeded_and_brackets_the_mean():
    values = [[v] for v in (1.31, 1.02, 1.45, 1.18, 1.27, 0.96, 1.52, 1.11, 1.39, 1.08)]
    mean = statistics.fmean(v[0] for v in values)
    ci = bootstrap_mean_ci(values)
    assert ci == bootstrap_mean_ci(values) == bootstrap_mean_ci(values, seed=0)  # deterministic: default seed 0
    assert bootstrap_mean_ci(values, seed=1) != ci  # the seed is used
    lo, hi = ci
    assert 0.96 < lo < mean < hi < 1.52  # strictly inside the range at n = 10
    # roughly symmetric data: the interval is about mean ± t_{0.975, 9} s / sqrt(n), within 25%
    half = t_975(9) * statistics.stdev(v[0] for v in values) / math.sqrt(len(values))
    assert 0.75 * half < (hi - lo) / 2 < 1.25 * half


def test_bootstrap_expanded_interval_covers_about_95_percent_at_8_prompts():
    """400 normal samples of 8 'prompts' (fixed seeds): the expanded interval covers the true mean 0.9375 of the
    time here; the plain percentile interval covers 0.875 on the same samples (the reason for expanding), so the
    bound 0.91 fails for an unexpanded interval."""
    rng, hits, trials = random.Random(12345), 0, 400
    for k in range(trials):
        xs = [rng.gauss(1.0, 0.2) for _ in range(8)]
        lo, hi = bootstrap_mean_ci([[x] for x in xs], samples=2000, seed=k)
        hits += lo <= 1.0 <= hi
    assert 0.91 <= hits / trials <= 0.985


def test_fmt():
    assert fmt(None) == "-" and fmt(float("nan")) == "-" and fmt(None, missing="n/a") == "n/a"
    assert fmt(1.234) == "1.23" and fmt(2, ".1f") == "2.0" and fmt(0.0) == "0.00"
