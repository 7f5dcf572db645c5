"""Ouroboros: every combination of component switches, warm and cold, emits exactly greedy's tokens;
inspiration, #Match-k and the KV cache after a step are checked on hand-built cases."""
import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from specbench.backends.torch.cached_lm import CachedLM
from specbench.decoding.jacobi import JacobiWindow, lookahead_step
from specbench.decoding.loop import verify_step
from specbench.decoding.ngram_pool import NGramPool
from specbench.decoding.proposal import StepContext
from specbench.errors import ConfigError
from specbench.methods.greedy import Greedy
from specbench.methods.ouroboros import Ouroboros, inspirations, match_k

from .test_equivalence import greedy_reference, pair_for


def test_inspiration_collects_phrases_after_the_first_mismatch():
    beta = 3
    d = [10, 11, 12, 13, 14, 15, 16]
    d_hat = [10, 99, 12, 13, 77, 15, 16, 17]  # l_d = 1 (d_2 differs); one extra prediction after d_7
    # runs of β-1 = 2 equal tokens starting after position l_d+1: (12,13) at k=2 and (15,16) at k=5
    assert inspirations(d, d_hat, 1, beta) == [[12, 13, 77], [15, 16, 17]]
    assert inspirations(d, d_hat, 4, beta) == [[15, 16, 17]]
    assert inspirations(d, d, 7, beta) == []  # nothing after a fully accepted draft


def test_match_k_counts_common_substrings_at_the_same_position():
    x, y = [1, 2, 3, 4, 5], [1, 2, 9, 4, 5]
    assert [match_k(x, y, k) for k in (1, 2, 3)] == [4, 2, 0]


def committed_cache_equals_fresh_forward(lm: CachedLM, model, committed: list[int]):
    fresh = CachedLM(model)
    fresh.forward(committed, keep_last=1)
    assert lm.length == fresh.length == len(committed)
    for ours, ref in zip(lm.cache.layers, fresh.cache.layers):
        torch.testing.assert_close(ours.keys, ref.keys, rtol=0, atol=1e-4)
        torch.testing.assert_close(ours.values, ref.values, rtol=0, atol=1e-4)


def test_cache_after_a_lookahead_step_holds_exactly_the_accepted_tokens():
    pair = pair_for("llama", 0.05)
    prompt = [5, 6, 7, 8] * 3
    greedy = Greedy(pair, "greedy").generate(prompt, 8, set()).tokens
    pool = NGramPool(4)
    pool.insert([prompt[-1], *greedy[:3]])  # the target's own continuation: fully accepted
    pool.insert([prompt[-1], 200, 201, 202])
    lm = CachedLM(pair.target)
    window = JacobiWindow(3, 4, prompt, __import__("random").Random(0))
    step = lookahead_step(lm, list(prompt), window, pool, None)
    assert step.accepted == greedy[:3] and step.next_token == greedy[3]
    committed_cache_equals_fresh_forward(lm, pair.target, prompt + step.accepted)


def test_cache_after_synthetic_verification_keeps_draft_prefix_and_best_suffix():
    pair = pair_for("llama", 0.05)
    prompt = [9, 8, 7, 6, 5]
    greedy = Greedy(pair, "greedy").generate(prompt, 10, set()).tokens
    method = Ouroboros(pair, gamma=3, window=4, beta=4, top_k=3)
    d = greedy[:3]
    method.pool.insert([d[-1], 250, 251, 252])  # a wrong suffix
    method.pool.insert([d[-1], *greedy[3:6]])  # the right one
    proposer = method.make_proposer(prompt)
    proposer._sentence_draft = lambda seq, limit, eos_ids: list(d)
    target, tokens = CachedLM(pair.target), list(prompt)
    proposal = proposer.propose(StepContext(tokens, 0, 100, set(), None))
    step = verify_step(target, tokens, proposal, None)
    proposer.observe(step)
    ex = proposer.extra()
    assert step.emitted == greedy[:7] and len(proposal.tokens) - len(d) == 6 == ex["suffix_tokens"]
    assert ex["draft_accepted"] == [3] and ex["suffix_accepted"] == [3] and ex["suffix_won"] == [0]
    assert ex["refinements"] == 1  # the wrong suffix is replaced by the target's outputs along it
    committed_cache_equals_fresh_forward(target, pair.target, prompt + greedy[:6])


switches = st.fixed_dictionaries({
    "phrase_draft": st.booleans(),
    "candidate_suffixes": st.booleans(),
    "inspiration": st.booleans(),
    "refinement": st.booleans(),
    "pool_from_prompt": st.booleans(),
})

cases = st.fixed_dictionaries({
    "arch": st.sampled_from(["llama", "gpt2"]),
    "noise": st.sampled_from([0.0, 0.05, 0.2]),
    "prompt": st.lists(st.integers(3, 258), min_size=1, max_size=10),
    "repeat": st.integers(1, 3),
    "gamma": st.integers(1, 7),
    "window": st.integers(1, 6),
    "beta": st.integers(2, 5),
    "top_k": st.integers(1, 4),
    "max_new_tokens": st.integers(1, 40),
    "eos_pick": st.one_of(st.none(), st.integers(0, 39)),
    "switches": switches,
})


def build(pair, case, warm_start=False, **extra):
    sw = dict(case["switches"])
    sw["refinement"] = sw["refinement"] and sw["candidate_suffixes"]
    return Ouroboros(pair, gamma=case["gamma"], window=case["window"], beta=case["beta"], top_k=case["top_k"],
                     warm_start=warm_start, match_stats=True, **sw, **extra)


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(case=cases)
def test_ouroboros_equals_greedy_for_every_switch_combination(case):
    pair = pair_for(case["arch"], case["noise"])
    prompt = case["prompt"] * case["repeat"]
    ref, eos = greedy_reference(pair, prompt, case["max_new_tokens"], case["eos_pick"])
    gen = build(pair, case).generate(prompt, case["max_new_tokens"], eos)
    assert gen.tokens == ref.tokens
    assert gen.target_forwards == len(gen.accept_lengths) == len(gen.extra["draft_accepted"])
    assert gen.accepted <= gen.drafted


@settings(max_examples=20, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(case=cases, second=st.lists(st.integers(3, 258), min_size=1, max_size=10))
def test_warm_start_keeps_the_pool_and_stays_lossless(case, second):
    pair = pair_for(case["arch"], case["noise"])
    method = build(pair, case, warm_start=True)
    for i, prompt in enumerate([case["prompt"] * case["repeat"], second]):
        method.reset(i)
        ref, eos = greedy_reference(pair, prompt, case["max_new_tokens"], case["eos_pick"])
        assert method.generate(prompt, case["max_new_tokens"], eos).tokens == ref.tokens


def test_components_do_their_work_on_a_repetitive_prompt():
    pair = pair_for("llama", 0.05)
    prompt = [11, 12, 13, 14, 15] * 4
    ref = greedy_reference(pair, prompt, 80, None)[0]
    method = Ouroboros(pair, gamma=4, window=6, beta=4, top_k=3, match_stats=True)
    gen = method.generate(prompt, 80, set())
    assert gen.tokens == ref.tokens
    ex = gen.extra
    assert ex["draft_phrase_steps"] > 0 and ex["suffix_tokens"] > 0 and len(ex["pool_size"]) == gen.target_forwards
    assert max(gen.accept_lengths) > 1
    assert len(ex["lcp"]) == len(ex["match_k"][1])
    cold = Ouroboros(pair, gamma=4, window=6, beta=4, top_k=3)
    cold.generate(prompt, 20, set())
    cold.reset(1)
    assert len(cold.pool) == 0


def test_bad_switches_are_refused():
    pair = pair_for("llama", 0.05)
    with pytest.raises(ConfigError, match="method.refinement"):
        Ouroboros(pair, candidate_suffixes=False, refinement=True)
    with pytest.raises(ConfigError, match="method.beta"):
        Ouroboros(pair, beta=1)
