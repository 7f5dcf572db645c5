"""SAM Decoding: the suffix automaton on hand-built sequences and against a brute-force scan (matches, first
occurrences, the shorter-suffix rule, a static corpus), the proposer's choice between its draft and a fallback's,
output identical to greedy (alone and with a draft-model fallback), caches and distributions exact above T=0, bad
settings and the configs' composition."""
import json

import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from specbench.components import build, needs_draft_model
from specbench.config_check import check_components
from specbench.decoding import loop
from specbench.decoding.cached_lm import CachedLM
from specbench.decoding.proposal import Proposal, StepContext
from specbench.decoding.sampling import Sampler
from specbench.decoding.suffix_automaton import Match, SuffixAutomaton
from specbench.errors import ConfigError
from specbench.methods.sam_decoding import SamDecoding, SamProposer
from specbench.methods.speculative import SpeculativeDecoding

from .distribution_helpers import one_thread  # noqa: F401  (autouse fixture: one torch thread)
from .distribution_helpers import EOS as SMALL_EOS
from .distribution_helpers import exact_sequence_distribution, goodness_of_fit, sample_generations, small_vocab_pair
from .test_config import composed
from .test_counters import check_counters
from .test_equivalence import greedy_reference, pair_for
from .test_speculative_sampling import fresh_probs, noisy_pair

EOS = 99
ALPHA = 1e-3


def automaton_of(tokens):
    sam = SuffixAutomaton()
    for token in tokens:
        sam.extend(token)
    return sam


def propose(tokens, max_draft=10, min_match=1, room=100, eos=(EOS,), static=None, bias=0, fallback=None):
    proposer = SamProposer(max_draft, min_match, static, bias, fallback)
    proposal = proposer.propose(StepContext(list(tokens), 0, room, set(eos), Sampler()))
    return proposal, proposer


# -- the automaton -------------------------------------------------------------------------------------------------

def test_the_longest_earlier_suffix_is_matched_and_its_first_occurrence_continued():
    #      0  1  2  3  4  5  6  7
    sam = automaton_of([1, 2, 3, 4, 5, 1, 2, 3])
    assert sam.match.length == 3  # (1, 2, 3) occurs at 0..2
    assert sam.continuation(sam.match, 3) == [4, 5, 1]
    # (1, 2) occurs at 0..1 and 3..4: the first occurrence is continued (prompt_lookup takes the newest, 7)
    sam = automaton_of([1, 2, 9, 1, 2, 7, 1, 2])
    assert sam.match.length == 2 and sam.continuation(sam.match, 2) == [9, 1]


def test_a_short_continuation_falls_back_to_a_shorter_suffix():
    sam = automaton_of([3, 4] * 5)  # a loop of period 2: the longest match (8 tokens) is followed by only 2
    assert sam.match.length == 8
    assert sam.continuation(sam.match, 2) == [3, 4]
    assert sam.continuation(sam.match, 6) == [3, 4, 3, 4, 3, 4]  # a shorter suffix, first seen earlier
    sam = automaton_of([3, 4, 5, 3, 4])  # no suffix has 8 after it: the single-token one's (the longest there is)
    assert sam.continuation(sam.match, 8) == [5, 3, 4]


def test_no_earlier_occurrence_matches_nothing():
    assert automaton_of([1, 2, 3, 4]).match == Match(0, 0)
    assert automaton_of([7]).match.length == 0
    sam = automaton_of([7, 7])  # the suffix itself never counts
    assert sam.match.length == 1 and sam.continuation(sam.match, 5) == [7]


def test_a_static_corpus_is_matched_without_crossing_sequences():
    static = SuffixAutomaton.of_sequences([[1, 2, 3, 4], [5, 6, 1, 2]])
    match = Match()
    for token in [9, 5, 6, 1]:
        match = static.read(match, token)
    assert match.length == 3 and static.continuation(match, 1) == [2]  # (5, 6, 1) ends at index 7 of the corpus
    # 5 wanted: (5, 6, 1) has 1 before its sequence ends, (1) first ends at index 0 and has 3
    assert static.continuation(match, 5) == [2, 3, 4]
    match = static.read(match, 2)
    assert match.length == 4 and static.continuation(match, 5) == [3, 4]  # (1, 2): not across the separator


def brute_force(tokens, want):
    """(match length, continuation) by scanning: the longest suffix of tokens that occurs in tokens[:-1]; its first
    occurrence's continuation, or the longest shorter suffix's whose first occurrence has ``want`` tokens after it,
    else the one-token suffix's."""
    n = len(tokens)

    def first_end(length):
        suffix = tokens[n - length:]
        return next(e for e in range(length - 1, n) if tokens[e - length + 1:e + 1] == suffix)

    longest = max((k for k in range(1, n) if first_end(k) < n - 1), default=0)
    if longest == 0 or want <= 0:
        return longest, []
    chosen = next((k for k in range(longest, 0, -1) if n - 1 - first_end(k) >= want), 1)
    end = first_end(chosen)
    return longest, tokens[end + 1:end + 1 + want]


@settings(max_examples=300, deadline=None)
@given(tokens=st.lists(st.integers(0, 3), min_size=1, max_size=50), want=st.integers(0, 8))
def test_the_online_automaton_finds_what_a_full_scan_finds(tokens, want):
    sam = SuffixAutomaton()
    for i, token in enumerate(tokens):  # checked after every token: the match must survive the states' clones
        sam.extend(token)
        length, continuation = brute_force(tokens[:i + 1], want)
        assert sam.match.length == length
        assert sam.continuation(sam.match, want) == continuation
    assert len(sam) <= max(2 * len(tokens) - 1, 2)  # at most 2n - 1 states (n >= 2): linear size


# -- the proposer ---------------------------------------------------------------------------------------------------

def test_the_draft_is_cut_before_an_eos_and_to_the_room():
    proposal, _ = propose([1, 2, 3, EOS, 5, 1, 2])
    assert proposal.tokens == [3] and proposal.is_chain and proposal.probs is None
    proposal, _ = propose([1, 2, 3, 4, 5, 1, 2], room=2)
    assert proposal.tokens == [3, 4]
    proposal, _ = propose([1, 2, 3, 4, 5, 1, 2], room=0)
    assert proposal.tokens == []
    proposal, _ = propose([1, 2, 3, 4, 5, 6, 1, 2], max_draft=3)
    assert proposal.tokens == [3, 4, 5]


def test_a_match_shorter_than_the_threshold_drafts_nothing_alone():
    proposal, proposer = propose([1, 2, 3, 4, 5, 1, 2], min_match=3)
    assert proposal.tokens == [] and proposer.match_length == [2] and proposer.stats["steps_sam"] == 0
    proposal, proposer = propose([1, 2, 3, 4, 5, 1, 2], min_match=2)
    assert proposal.tokens == [3, 4, 5, 1, 2] and proposer.stats["steps_sam"] == 1


def test_a_static_match_counts_corpus_bias_tokens_less():
    static = SuffixAutomaton.of_sequences([[7, 8, 1, 2, 3, 50, 51]])
    tokens = [1, 2, 3, 40, 41, 7, 8, 1, 2, 3]  # dynamic match (1, 2, 3): 3 tokens; static (7, 8, 1, 2, 3): 5
    assert propose(tokens, static=static, bias=0)[0].tokens == [50, 51]
    assert propose(tokens, static=static, bias=2)[0].tokens == [40, 41, 7, 8, 1, 2, 3]  # 5 - 2 is no longer
    _, proposer = propose(tokens, static=static, bias=1)
    assert proposer.match_length == [4]


class StubFallback:
    """A fallback proposer that proposes [42] and records what it is shown."""

    draft = "the fallback's CachedLM"

    def __init__(self):
        self.proposed, self.observed = 0, []

    def propose(self, context):
        self.proposed += 1
        return Proposal.chain([42])

    def observe(self, step):
        self.observed.append(step)

    def extra(self):
        return {"proposed": self.proposed}


def test_the_fallback_drafts_below_the_threshold_and_observes_every_step():
    fallback = StubFallback()
    proposer = SamProposer(10, 3, fallback=fallback)
    assert proposer.draft == "the fallback's CachedLM"  # its forwards are counted
    context = StepContext([1, 2, 3, 4, 1, 2], 0, 100, set(), Sampler())
    assert proposer.propose(context).tokens == [42]  # match (1, 2): shorter than 3
    proposer.observe("step 1")
    context = StepContext([1, 2, 3, 4, 1, 2, 3], 1, 100, set(), Sampler())
    assert proposer.propose(context).tokens == [4, 1, 2, 3]  # match (1, 2, 3)
    proposer.observe("step 2")
    assert fallback.proposed == 1 and fallback.observed == ["step 1", "step 2"]
    assert proposer.extra() == {"steps": 2, "steps_sam": 1, "steps_fallback": 1, "match_length": [2, 3],
                                "source": ["fallback", "sam"], "fallback": {"proposed": 1}}


# -- on the loop ----------------------------------------------------------------------------------------------------

cases = st.fixed_dictionaries({
    "arch": st.sampled_from(["llama", "gpt2"]),
    "noise": st.sampled_from([0.0, 0.05, 0.2]),
    "prompt": st.lists(st.integers(3, 258), min_size=1, max_size=10),
    "repeat": st.integers(1, 3),  # repeated prompts give the automaton something to match
    "max_draft": st.integers(1, 8),
    "min_match_length": st.integers(1, 4),
    "gamma": st.one_of(st.none(), st.integers(1, 5)),  # None: SAM alone; else a draft-model fallback with this γ
    "max_new_tokens": st.integers(1, 40),
    "eos_pick": st.one_of(st.none(), st.integers(0, 39)),
})


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(case=cases)
def test_sam_decoding_equals_greedy(case):
    pair = pair_for(case["arch"], case["noise"])
    prompt = case["prompt"] * case["repeat"]
    ref, eos = greedy_reference(pair, prompt, case["max_new_tokens"], case["eos_pick"])
    fallback = None if case["gamma"] is None else SpeculativeDecoding(pair, "speculative", gamma=case["gamma"])
    method = SamDecoding(pair, max_draft=case["max_draft"], min_match_length=case["min_match_length"],
                         fallback=fallback)
    gen = method.generate(prompt, case["max_new_tokens"], eos)
    assert gen.tokens == ref.tokens
    check_counters(gen, "sam_decoding")
    assert gen.target_forwards == len(gen.accept_lengths) == gen.extra["steps"]
    source = gen.extra["source"]
    assert len(source) == gen.extra["steps"] and source.count("sam") == gen.extra["steps_sam"]
    assert source.count("fallback") == gen.extra["steps_fallback"]
    if fallback is None:
        assert gen.draft_forwards == 0 and "fallback" not in source
    else:  # the fallback's draft forwards are counted: one per token it drafted (it observes, so lists, every step)
        sl = gen.extra["fallback"]["sl"]
        assert gen.draft_forwards == sum(n for n, by in zip(sl, source) if by == "fallback")
        assert "none" not in source
