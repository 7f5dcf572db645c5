"""Speculation-lookahead policies: hand-written schedules, and every policy emits exactly greedy's tokens."""
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from specbench.methods.sl_policies import ConfidenceSL, HeuristicSL, StaticSL
from specbench.methods.speculative import SpeculativeDecoding

from .test_equivalence import cases, greedy_reference, pair_for


def test_heuristic_schedule_on_a_hand_written_acceptance_sequence():
    policy = HeuristicSL(initial=5)
    schedule = []
    for accepted, drafted in [(5, 5), (7, 7), (3, 9), (0, 8), (7, 7), (0, 9), (0, 8), (0, 7), (0, 6), (0, 5),
                              (0, 4), (0, 3), (0, 2), (0, 1), (1, 1)]:
        assert policy.draft_length() == drafted
        policy.observe(accepted, drafted)
        schedule.append(policy.draft_length())
    assert schedule == [7, 9, 8, 7, 9, 8, 7, 6, 5, 4, 3, 2, 1, 1, 3]  # +2 on full acceptance, -1 else, min 1
    policy.reset()
    assert policy.draft_length() == 3  # persistent (transformers' 'heuristic'): carries over to the next prompt
    transient = HeuristicSL(initial=5, persistent=False)
    transient.observe(5, 5)
    transient.reset()
    assert transient.draft_length() == 5


def test_confidence_policy_stops_below_the_threshold():
    policy = ConfidenceSL(threshold=0.5, sl_max=7)
    confident = torch.tensor([4.0, 0.0, 0.0])  # top probability ~0.96
    unsure = torch.tensor([0.1, 0.0, 0.0])  # ~0.36
    assert policy.draft_length() == 7
    assert policy.keep_drafting(1, confident, 0) and not policy.keep_drafting(2, unsure, 0)
    assert StaticSL(3).keep_drafting(1, unsure, 0) and StaticSL(3).draft_length() == 3


policies = st.one_of(
    st.builds(StaticSL, st.integers(1, 7)),
    st.builds(HeuristicSL, initial=st.integers(1, 7), persistent=st.booleans()),
    st.builds(ConfidenceSL, threshold=st.floats(0, 1), sl_max=st.integers(1, 10)),
)


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(case=cases, policy=policies)
def test_every_policy_emits_greedy_tokens(case, policy):
    pair = pair_for(case["arch"], case["noise"])
    method = SpeculativeDecoding(pair, "policy", policy=policy)
    for seed in range(2):  # a second prompt exercises what persists across prompts
        method.reset(seed)
        ref, eos = greedy_reference(pair, case["prompt"], case["max_new_tokens"], case["eos_pick"])
        gen = method.generate(case["prompt"], case["max_new_tokens"], eos)
        assert gen.tokens == ref.tokens
        assert gen.accepted <= gen.drafted


@settings(max_examples=30, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(case=cases, sl_max=st.integers(1, 12))
def test_oracle_drafts_exactly_the_tokens_the_target_accepts(case, sl_max):
    from specbench.methods.sl_policies import OracleSL

    pair = pair_for(case["arch"], case["noise"])
    ref, eos = greedy_reference(pair, case["prompt"], case["max_new_tokens"], case["eos_pick"])
    method = SpeculativeDecoding(pair, "oracle_sl", policy=OracleSL(sl_max))
    method.reset(0)
    method.prepare(case["prompt"], case["max_new_tokens"], eos)  # untimed in the runner
    gen = method.generate(case["prompt"], case["max_new_tokens"], eos)
    assert gen.tokens == ref.tokens
    assert gen.drafted == gen.accepted  # never a rejected token: no draft forward spent on one
    sl, steps = gen.extra["sl"], gen.accept_lengths
    assert [d for d in sl[:-1]] == [n - 1 for n in steps[:-1]], (sl, steps)
    if gen.tokens[-1] in eos:  # the last step: its EOS is a draft token (no bonus kept after it) or the bonus
        assert sl[-1] in (steps[-1] - 1, steps[-1])
    else:
        assert sl[-1] == steps[-1] - 1
    assert all(d <= sl_max for d in sl)


def test_oracle_needs_greedy_decoding():
    import pytest

    from specbench.errors import ConfigError
    from specbench.methods.sl_policies import OracleSL

    with pytest.raises(ConfigError, match="sampling.temperature"):  # when the method is built, before any work
        SpeculativeDecoding(pair_for("llama", 0.05), "oracle_sl", policy=OracleSL(8), temperature=0.8)
