"""Per-position acceptance α_k: the per-step rule (cut steps included) and α_k by hand on hand-built records,
the ``proposed`` counter of real methods on tiny models, the runner's record, the headline line and the figure.

α_k = among steps whose proposal reached depth k and whose first k-1 draft tokens were accepted, the fraction
that accepted the k-th. Every expected value is worked out by hand in the comment beside it.
"""
from types import SimpleNamespace

import pytest
from omegaconf import OmegaConf

from specbench.decoding.generation import Generation
from specbench.methods.greedy import Greedy
from specbench.methods.hf_assisted import HFAssisted
from specbench.methods.lookahead import Lookahead
from specbench.methods.speculative import SpeculativeDecoding
from specbench.analysis.metrics import acceptance_by_position, accepted_per_step, summarize
from specbench.analysis.console import alpha_text, render_headline
from specbench.report.figures import FIGURES, alpha_curve
from specbench.engines.loops import LoopBackend
from specbench.records.schema import TURN_FIELDS, RunRecord, TurnRecord, combine_turns

from .test_counters import distinct_start
from .test_equivalence import greedy_reference, pair_for

EOS = 99


def turn_of(gen: Generation) -> TurnRecord:
    """The fields of a record (one turn) that α reads, as LoopBackend.measure_turn writes them."""
    return TurnRecord(accept_lengths=list(gen.accept_lengths), proposed=list(gen.proposed),
                      accepted_steps=list(gen.accepted_steps), accepted=gen.accepted)


def rec(accept_lengths, proposed, accepted_steps):
    """A single-turn record (the fields LoopBackend.measure_turn writes, plus what summarize reads)."""
    n, accepted = sum(accept_lengths), sum(accepted_steps)
    return RunRecord(prompt_id="p", repeat=0, prompt_tokens=3, output_ids=[1] * n, output_text="x", new_tokens=n,
                     wall_s=1.0, prefill_s=None, target_forwards=len(accept_lengths), draft_forwards=0,
                     drafted=sum(proposed), accepted=accepted, accept_lengths=accept_lengths, proposed=proposed,
                     accepted_steps=accepted_steps, forward_sizes={}, extra={})


# -- the per-step rule -------------------------------------------------------------------------------------------

def steps(*calls, max_new_tokens=100):
    """A Generation built with add_step: calls of (emitted tokens, accepted drafts, proposal depth)."""
    gen, out = Generation(tokens=[]), []
    for emitted, accepted, depth in calls:
        gen.add_step(out, emitted, accepted, max_new_tokens, {EOS}, proposed=depth)
        out += emitted[:gen.accept_lengths[-1]]
    return gen


def test_whole_steps_accept_their_length_minus_the_targets_token():
    gen = steps(([1, 2, 3], 2, 4), ([4], 0, 4), ([5, 6, 7, 8, 9], 4, 4))
    assert gen.accept_lengths == [3, 1, 5] and gen.proposed == [4, 4, 4] and gen.accepted == 6
    assert accepted_per_step(turn_of(gen)) == [(2, 4), (0, 4), (4, 4)]


def test_a_step_cut_at_an_eos_among_its_drafts_accepted_every_token_it_kept():
    # 4 drafts accepted of 5 proposed, the EOS is the 3rd: kept 3 (all drafts), proposed trimmed to 3
    gen = steps(([1, 2], 1, 4), ([3, 4, EOS, 5, 6], 4, 5))
    assert gen.accept_lengths == [2, 3] and gen.proposed == [4, 3] and gen.accepted == 1 + 3
    assert accepted_per_step(turn_of(gen)) == [(1, 4), (3, 3)]
    # the same lists from a whole last step (depth 3, 2 accepted, the target's token the EOS): 2 accepted
    whole = steps(([1, 2], 1, 4), ([3, 4, EOS], 2, 3))
    assert whole.accept_lengths == [2, 3] and whole.proposed == [4, 3] and whole.accepted == 1 + 2
    assert accepted_per_step(turn_of(whole)) == [(1, 4), (2, 3)]


def test_a_step_cut_at_the_budget_and_an_eos_as_the_first_draft():
    # budget 4: 2 tokens out, then 3 drafts accepted of 3 + the target's token, room for 2 -> kept 2, both drafts
    gen = steps(([1, 2], 1, 2), ([3, 4, 5, 6], 3, 3), max_new_tokens=4)
    assert gen.accept_lengths == [2, 2] and gen.proposed == [2, 2] and gen.accepted == 1 + 2
    assert accepted_per_step(turn_of(gen)) == [(1, 2), (2, 2)]
    # the first draft is the EOS and accepted: kept 1, a draft
    eos_first = steps(([EOS, 7, 8], 2, 2))
    assert eos_first.accept_lengths == [1] and eos_first.proposed == [1] and eos_first.accepted == 1
    assert accepted_per_step(turn_of(eos_first)) == [(1, 1)]


def test_no_steps_without_proposed():
    old = RunRecord.from_dict({"accept_lengths": [3, 1], "accepted": 2})  # a line written before it existed
    assert accepted_per_step(old) == []
    assert accepted_per_step(RunRecord(accept_lengths=[3, 1], proposed=[], accepted_steps=[])) == []  # hf, no fit
    assert accepted_per_step(RunRecord(proposed=[4, 2], accepted_steps=[2])) == []  # lengths disagree


# -- α_k by hand -------------------------------------------------------------------------------------------------

def test_alpha_by_hand_over_records_with_a_cut_step():
    whole = rec([3, 1, 5], [4, 4, 4], [2, 0, 4])
    cut = rec([2, 3], [4, 3], [1, 3])  # a last step cut at an EOS among its drafts: 3 kept, all accepted drafts
    # α_1: 5 steps reach depth 1, 4 accept it (all but the 0) = 0.8
    # α_2: steps with >= 1 accepted and depth >= 2: 2, 4, 1, 3 -> 3 accept the 2nd = 0.75
    # α_3: >= 2 accepted and depth >= 3: 2, 4, 3 -> 4 and 3 accept the 3rd = 2/3
    # α_4: >= 3 accepted and depth >= 4: only the 4 (the cut step's depth is 3) -> 1.0
    assert acceptance_by_position([whole, cut]) == pytest.approx([0.8, 0.75, 2 / 3, 1.0])
    # the same accept_lengths from a whole last step (2 accepted of depth 3 + the target's token): α_3 = 1/3
    assert acceptance_by_position([whole, rec([2, 3], [4, 3], [1, 2])]) == pytest.approx([0.8, 0.75, 1 / 3, 1.0])
    # max_k: cut short, or padded with None where no step reached
    assert acceptance_by_position([whole, cut], max_k=2) == pytest.approx([0.8, 0.75])
    assert acceptance_by_position([whole], max_k=6)[4:] == [None, None]
    # α_1 alone: whole's steps 2, 0, 4 -> 2/3; α_2: 2 and 4 reach -> both = 1.0; α_3: 1/2; α_4: 1/1
    assert acceptance_by_position([whole]) == pytest.approx([2 / 3, 1.0, 0.5, 1.0])


def test_a_multi_turn_record_concatenates_its_turns_steps():
    # two turns each ending in a cut step; the top-level lists are the turns' concatenated, accepted summed
    t1, t2 = rec([2, 3], [4, 3], [1, 3]), rec([3, 2], [2, 2], [2, 2])  # steps (1, 4), (3, 3); then (2, 2), (2, 2)
    combined = combine_turns([t1, t2])
    record = RunRecord(**{f: getattr(combined, f) for f in TURN_FIELDS}, prompt_id="p", repeat=0, turns=[t1, t2])
    assert record.proposed == [4, 3, 2, 2] and record.accepted == 8
    # α_1: 4 of 4; α_2: all 4 reach it (>= 1 accepted, depth >= 2), 3 accept it ((1, 4) does not) = 0.75;
    # α_3: only (3, 3) reaches it (>= 2 accepted, depth >= 3) and accepts = 1.0; α_4: (1, 4) had 1 accepted: None
    assert acceptance_by_position([record]) == [1.0, 0.75, 1.0, None]
    assert record.accepted_steps == [1, 3, 2, 2]  # the raw per-step counts concatenate like the other lists


def test_no_alpha_for_greedy_or_old_records():
    greedy = rec([1, 1, 1], [0, 0, 0], [0, 0, 0])
    written = {k: v for k, v in rec([3, 2], [4, 4], [2, 1]).to_dict().items()
               if k not in ("proposed", "accepted_steps")}
    old = RunRecord.from_dict(written)  # a line written before ``proposed`` existed
    assert acceptance_by_position([greedy]) == [] and acceptance_by_position([old]) == []
    assert acceptance_by_position([]) == []
    assert summarize([greedy])["alpha"] is None and summarize([old])["alpha"] is None
    combined = combine_turns([old, old])
    assert combined.proposed == []  # turns written before ``proposed``: an empty list, no α
    # mixed with records that have it: only those count
    assert acceptance_by_position([old, greedy, rec([3, 1, 5], [4, 4, 4], [2, 0, 4])]) == pytest.approx(
        [2 / 3, 1.0, 0.5, 1.0])


def test_summary_and_headline():
    s = summarize([rec([3, 1, 5], [4, 4, 4], [2, 0, 4])])
    assert s["alpha"] == pytest.approx([2 / 3, 1.0, 0.5, 1.0])
    assert "α_k (per-position acceptance): 0.67 1.00 0.50 1.00" in render_headline("m", s).splitlines()
    greedy_lines = render_headline("g", summarize([rec([1], [0], [0])])).splitlines()
    assert not any(line.startswith("α_k") for line in greedy_lines)
    assert alpha_text([0.5, None, 0.25]) == "0.50"  # up to the first position without data
    assert alpha_text([0.5] * 10, shown=3) == "0.50 0.50 0.50 …"
    assert alpha_text(None) == alpha_text([]) == ""


# -- real methods on tiny models ---------------------------------------------------------------------------------

METHODS = {
    "speculative": lambda pair: SpeculativeDecoding(pair, "speculative", gamma=4),
    "lookahead": lambda pair: Lookahead(pair, window=3, ngram=4, guesses=3),
    "hf_assisted": lambda pair: HFAssisted(pair, "hf_assisted", gamma=3),
}
CASES = [  # (noise, prompt, max_new_tokens, eos_pick): no EOS, an EOS inside the output, a small budget
    (0.05, [5, 6, 7], 24, None),
    (0.0, [40, 41, 42, 43], 20, 6),
    (0.02, [9, 10, 11, 12, 13], 7, None),
]


@pytest.mark.parametrize("name", sorted(METHODS))
def test_methods_record_a_proposal_depth_per_step(name):
    for noise, prompt, budget, eos_pick in CASES:
        pair = pair_for("llama", noise)
        ref, eos = greedy_reference(pair, prompt, budget, eos_pick)
        method = METHODS[name](pair)
        method.reset(0)
        gen = method.generate(prompt, budget, eos)
        assert gen.tokens == ref.tokens
        assert len(gen.proposed) == len(gen.accept_lengths) > 0, (name, gen.proposed, gen.accept_lengths)
        per_step = accepted_per_step(turn_of(gen))
        assert all(0 <= a <= p for a, p in per_step), (name, per_step)
        assert sum(a for a, _ in per_step) == gen.accepted  # the per-step counts add up to the total
        if name == "speculative":
            assert all(p <= 4 for p in gen.proposed)
        if name == "hf_assisted":
            assert gen.proposed == gen.extra["sl"]  # its drafted counts (its tokens are already cut at the EOS)
        alpha = acceptance_by_position([turn_of(gen)])
        assert len(alpha) == max(gen.proposed) and all(a is None or 0.0 <= a <= 1.0 for a in alpha)


def test_lookahead_records_the_depth_of_a_guess_the_target_accepts():
    pair = pair_for("llama", 0.0)
    prompt = [5, 6, 7]
    greedy = Greedy(pair, "greedy").generate(prompt, 12, set()).tokens
    method = METHODS["lookahead"](pair)
    method.pool.insert([prompt[-1], *greedy[:3]])  # a 3-token guess the target accepts in full
    gen = method.generate(prompt, 12, set())
    assert gen.tokens == greedy
    assert gen.proposed[0] == 3 and gen.accept_lengths[0] == 4  # 3 accepted + the target's token
    assert accepted_per_step(turn_of(gen))[0] == (3, 3)


def test_an_eos_accepted_as_a_draft_token_counts_as_accepted():
    pair = pair_for("llama", 0.0)  # the draft is the target: every draft token is accepted
    prompt, greedy = distinct_start(pair)  # greedy's first three tokens are distinct
    gen = SpeculativeDecoding(pair, "speculative", gamma=5).generate(prompt, 12, {greedy[2]})
    assert gen.accept_lengths == [3] and gen.proposed == [3] and gen.accepted == 3
    assert acceptance_by_position([turn_of(gen)]) == [1.0, 1.0, 1.0]


def test_greedy_proposes_nothing_and_the_runner_records_proposed():
    pair = pair_for("llama", 0.05)
    gen = Greedy(pair, "greedy").generate([9, 10, 11], 5, set())
    assert gen.proposed == [0] * 5 and acceptance_by_position([turn_of(gen)]) == []
    backend = LoopBackend(pair, max_new_tokens=8, warmup=0)
    turn = backend.measure_turn(SpeculativeDecoding(pair, "speculative", gamma=3), [5, 6, 7])
    assert len(turn.proposed) == len(turn.accept_lengths) and turn.proposed


# -- the figure --------------------------------------------------------------------------------------------------

def cell(method, records, status="ok"):
    values = {"method.name": method, "model.name": "tiny"}
    return SimpleNamespace(status=status, records=records, spec=SimpleNamespace(method=method, pair="tiny"),
                           value=values.get, summary={})


def experiment(*cells):
    spec = OmegaConf.create({"title": "T", "rows": [{"key": "method.name", "title": "Method"}],
                             "columns": [{"key": "model.name", "title": "Pair"}], "metrics": ["tau"],
                             "labels": {"method.name": {"speculative": "SPS"}}})
    return SimpleNamespace(name="t", spec=spec, cells=list(cells), extras={}, entries=[], published=[])


def test_alpha_curve_draws_one_line_per_cell_with_proposed(tmp_path):
    assert FIGURES["alpha_curve"] is alpha_curve
    greedy = cell("greedy", [rec([1, 1], [0, 0], [0, 0])])
    old = cell("lookahead", [RunRecord.from_dict({k: v for k, v in rec([3, 2], [4, 4], [2, 1]).to_dict().items()
                                                  if k != "proposed"})])
    assert alpha_curve(experiment(greedy, old), tmp_path / "none") == []  # no α anywhere: no figure
    speculative = cell("speculative", [rec([3, 1, 5], [4, 4, 4], [2, 0, 4])])
    ouroboros = cell("ouroboros", [rec([2, 3], [4, 3], [1, 3])])
    paths = alpha_curve(experiment(greedy, old, speculative, ouroboros, cell("x", [], status="not run yet")), tmp_path)
    assert [p.name for p in paths] == ["alpha_curve.png", "alpha_curve.pdf"]
    assert all(p.stat().st_size > 5000 for p in paths)
