"""Prompt lookup decoding: the n-gram matcher on hand-built sequences (which occurrence, n fallback, EOS and room
cuts, no match), the incremental index against a brute-force scan, ``occurrence=earliest`` against transformers'
own PromptLookupCandidateGenerator, ``earliest_whole`` against Spec-Bench's rule, and output identical to greedy."""
import time

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
import torch

from specbench.decoding.proposal import StepContext
from specbench.decoding.sampling import Sampler
from specbench.errors import ConfigError
from specbench.methods.prompt_lookup import OCCURRENCES, NGramIndex, PromptLookup, PromptLookupProposer, lookup

from .test_counters import check_counters
from .test_equivalence import greedy_reference, pair_for

EOS = 99


def propose(tokens, max_n=3, num_pred=10, min_n=1, room=100, eos=(EOS,)):
    proposer = PromptLookupProposer(min_n, max_n, num_pred, "recent")  # the hand-built cases are recent's
    proposal = proposer.propose(StepContext(list(tokens), 0, room, set(eos), Sampler()))
    assert proposal.is_chain and proposal.probs is None  # point masses
    return proposal.tokens, proposer.match_ngram[-1]


def test_the_longest_ngram_wins_and_its_continuation_is_proposed():
    #         0  1  2  3  4  5  6  7  8  9  10
    tokens = [1, 2, 3, 4, 5, 6, 8, 3, 7, 2, 3]
    # the last 3-gram (7, 2, 3) occurs nowhere before; the 2-gram (2, 3) at 1..2, followed by 4 5 6 8 ...
    assert propose(tokens, num_pred=4) == ([4, 5, 6, 8], 2)
    # a 3-gram match beats the 2-gram: (9, 2, 3) occurs once before
    tokens = [9, 2, 3, 11, 12, 2, 3, 13, 9, 2, 3]
    assert propose(tokens, num_pred=3) == ([11, 12, 2], 3)
    assert propose(tokens, max_n=2, num_pred=3) == ([13, 9, 2], 2)  # (2, 3): its most recent occurrence


def test_n_falls_back_to_shorter_ngrams_down_to_min_ngram_size():
    tokens = [5, 6, 7, 20, 21, 22, 7]  # no earlier (22, 7) or (21, 22, 7); 7 occurs at 2
    assert propose(tokens, num_pred=3) == ([20, 21, 22], 1)
    assert propose(tokens, num_pred=3, min_n=2) == ([], 0)  # 1-grams not tried


def test_the_most_recent_occurrence_with_a_full_continuation_is_taken():
    #         0  1  2  3  4  5  6  7  8  9  10 11
    tokens = [1, 2, 5, 6, 7, 8, 1, 2, 9, 4, 1, 2]
    assert propose(tokens, max_n=2, num_pred=2) == ([9, 4], 2)  # transformers (earliest) would give 5 6
    assert propose(tokens, max_n=2, num_pred=4) == ([9, 4, 1, 2], 2)  # the newest still has 4 tokens after it
    # 5 wanted: the newest has only 4 after it, the one before it has them all
    assert propose(tokens, max_n=2, num_pred=5) == ([5, 6, 7, 8, 1], 2)
    # a loop of period 2: the newest occurrence leaves 2 tokens, one further back leaves the full 6
    assert propose([3, 4] * 5, max_n=2, num_pred=6) == ([3, 4, 3, 4, 3, 4], 2)
    # none has the full continuation: the oldest, which has the longest
    assert propose([3, 4, 5, 3, 4], max_n=2, num_pred=8) == ([5, 3, 4], 2)


def test_the_proposal_stops_before_an_eos():
    tokens = [1, 2, 3, 4, EOS, 5, 6, 1, 2, 3]
    assert propose(tokens, num_pred=5) == ([4], 3)
    # a continuation that starts with an EOS is empty: the next n is tried
    tokens = [8, 1, 2, 3, EOS, 2, 3, 6, 1, 2, 3]
    assert propose(tokens, max_n=3, num_pred=4) == ([6, 1, 2, 3], 2)
    # the EOS cut comes after the occurrence is chosen: with 5 wanted the older (2, 3), with all 5 after it, wins
    assert propose(tokens, max_n=3, num_pred=5) == ([], 0)
    assert propose([1, 2, EOS, 1, 2], max_n=2, num_pred=5) == ([], 0)


def test_the_proposal_is_cut_to_the_room():
    tokens = [1, 2, 3, 4, 5, 6, 1, 2]
    assert propose(tokens, num_pred=10, room=2) == ([3, 4], 2)
    assert propose(tokens, num_pred=10, room=0) == ([], 0)


def test_no_match_proposes_nothing():
    assert propose([1, 2, 3, 4, 5]) == ([], 0)
    assert propose([7]) == ([], 0)
    assert propose([7, 7], max_n=3, num_pred=4) == ([7], 1)  # the suffix itself never counts as a match


def brute_force(tokens, min_n, max_n, want, eos):
    """The matching rule written as a scan of the whole sequence (the reference for the index)."""
    last = len(tokens) - 1
    if want <= 0:
        return 0, []
    for n in range(max_n, min_n - 1, -1):
        if len(tokens) < n:
            continue
        suffix = tokens[-n:]
        ends = [e for e in range(n - 1, last) if tokens[e - n + 1:e + 1] == suffix]
        if not ends:
            continue
        full = [e for e in ends if last - e >= want]
        end = full[-1] if full else ends[0]
        continuation = tokens[end + 1:end + 1 + want]
        cut = next((i for i, t in enumerate(continuation) if t in eos), len(continuation))
        if cut:
            return n, continuation[:cut]
    return 0, []


@settings(max_examples=300, deadline=None)
@given(tokens=st.lists(st.integers(0, 5), min_size=1, max_size=60), sizes=st.tuples(st.integers(1, 4),
       st.integers(0, 3)), want=st.integers(0, 8), cuts=st.lists(st.integers(1, 60), max_size=5))
def test_the_incremental_index_finds_what_a_full_scan_finds(tokens, sizes, want, cuts):
    min_n, max_n = sizes[0], sizes[0] + sizes[1]
    index = NGramIndex(min_n, max_n)
    for length in sorted(set(cuts) | {len(tokens)}):  # the sequence grows between lookups, as it does in decoding
        seq = tokens[:length]
        index.extend(seq, len(seq) - 1)
        assert lookup(index, seq, want, {5}) == brute_force(seq, min_n, max_n, want, {5})


def indexed(tokens, max_n, min_n=1):
    index = NGramIndex(min_n, max_n)
    index.extend(tokens, len(tokens) - 1)
    return index


@settings(max_examples=400, deadline=None)
@given(tokens=st.lists(st.integers(0, 5), min_size=1, max_size=50), max_n=st.integers(1, 4),
       want=st.integers(1, 8), eos=st.sampled_from([None, 5]))
def test_earliest_proposes_what_transformers_prompt_lookup_proposes(tokens, max_n, want, eos):
    """The reference: transformers' PromptLookupCandidateGenerator (what ``prompt_lookup_num_tokens`` runs), on the
    same history, n-gram sizes (max down to 1), length and EOS."""
    from transformers.generation.candidate_generator import PromptLookupCandidateGenerator

    reference = PromptLookupCandidateGenerator(eos_token_id=None if eos is None else torch.tensor([eos]),
                                               num_output_tokens=want, max_matching_ngram_size=max_n,
                                               max_length=10 ** 6)
    candidates, _ = reference.get_candidates(torch.tensor([tokens]))
    theirs = candidates[0, len(tokens):].tolist()
    ours = lookup(indexed(tokens, max_n), tokens, want, set() if eos is None else {eos}, "earliest")[1]
    assert ours == theirs


def spec_bench_rule(tokens, max_n, num_pred):
    """Spec-Bench's PLD as its code reads, written out here: for n from max_n down to 1, the earliest window equal
    to the last n tokens whose continuation [i + n, i + n + num_pred) lies inside the sequence and starts before
    the last n-gram does; else nothing."""
    length = len(tokens)
    for n in range(min(max_n, length), 0, -1):
        for i in range(length - n + 1):
            start = i + n
            if tokens[i:i + n] == tokens[length - n:] and start + num_pred <= length and start < length - n:
                return tokens[start:start + num_pred]
    return []


@settings(max_examples=400, deadline=None)
@given(tokens=st.lists(st.integers(0, 4), min_size=1, max_size=50), max_n=st.integers(1, 4),
       num_pred=st.integers(1, 8))
def test_earliest_whole_is_spec_benchs_rule(tokens, max_n, num_pred):
    assert lookup(indexed(tokens, max_n), tokens, num_pred, set(), "earliest_whole")[1] == \
        spec_bench_rule(tokens, max_n, num_pred)


def test_the_three_occurrences_on_one_history():
    #         0  1  2  3  4  5  6  7  8  9 10 11
    tokens = [7, 1, 2, 3, 1, 4, 1, 2, 8, 9, 0, 1]
    index = indexed(tokens, 2)  # the last 2-gram (0, 1) occurs nowhere before; 1 at 1, 4, 6
    assert lookup(index, tokens, 3, set(), "recent") == (1, [2, 8, 9])    # the newest followed by 3 tokens
    assert lookup(index, tokens, 3, set(), "earliest") == (1, [2, 3, 1])  # the first
    assert lookup(index, tokens, 3, set(), "earliest_whole") == (1, [2, 3, 1])
    # 6 wanted: the earliest 1 (at 1) is followed by 10 tokens, so whole; 11 wanted: no 1 is
    assert lookup(index, tokens, 6, set(), "earliest_whole", whole=6) == (1, [2, 3, 1, 4, 1, 2])
    assert lookup(index, tokens, 3, set(), "earliest_whole", whole=11)[1] == []  # none followed by 11
    assert lookup(index, tokens, 3, {3}, "earliest") == (1, [2])  # cut before EOS
    assert lookup(index, tokens, 3, {2}, "earliest") == (0, [])   # the cut empties it: nothing (as transformers)
    assert lookup(index, tokens, 3, {2}, "recent") == (0, [])     # its pick (at 6) starts with 2; no n < 1


def test_a_long_prompt_is_indexed_once_not_scanned_per_step():
    prompt = [(i * 7919) % 5000 for i in range(20000)]
    proposer = PromptLookupProposer(1, 3, 10, "earliest")
    tokens = list(prompt)
    seconds = []  # the first step (indexes the prompt), then the other 499 together
    start = time.perf_counter()
    for step in range(500):
        if step == 1:
            seconds.append(time.perf_counter() - start)
            start = time.perf_counter()
        proposal = proposer.propose(StepContext(tokens, step, 1000, set(), Sampler()))
        assert proposer.index.indexed == len(tokens) - 1  # every n-gram but the newest, each indexed once
        tokens += proposal.tokens[:1] + [step % 5000]
    seconds.append(time.perf_counter() - start)
    # measured against the same process's own indexing of the prompt, so a busy or slow machine cannot fail it:
    # 499 steps cost ~0.3x one indexing here; a scan of the 20k tokens per step would cost ~500x
    assert seconds[1] < 50 * seconds[0], seconds


cases = st.fixed_dictionaries({
    "arch": st.sampled_from(["llama", "gpt2"]),
    "prompt": st.lists(st.integers(3, 258), min_size=1, max_size=10),
    "repeat": st.integers(1, 3),  # repeated prompts give lookups something to find
    "max_ngram_size": st.integers(1, 4),
    "min_ngram_size": st.integers(1, 4),
    "num_pred_tokens": st.integers(1, 8),
    "max_new_tokens": st.integers(1, 40),
    "eos_pick": st.one_of(st.none(), st.integers(0, 39)),
    "occurrence": st.sampled_from(OCCURRENCES),
})


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(case=cases)
def test_prompt_lookup_equals_greedy(case):
    pair = pair_for(case["arch"], 0.05)
    prompt = case["prompt"] * case["repeat"]
    ref, eos = greedy_reference(pair, prompt, case["max_new_tokens"], case["eos_pick"])
    min_n = min(case["min_ngram_size"], case["max_ngram_size"])
    method = PromptLookup(pair, max_ngram_size=case["max_ngram_size"], min_ngram_size=min_n,
                          num_pred_tokens=case["num_pred_tokens"], occurrence=case["occurrence"])
    gen = method.generate(prompt, case["max_new_tokens"], eos)
    assert gen.tokens == ref.tokens
    check_counters(gen, "prompt_lookup")
    assert gen.draft_forwards == 0 and "draft" not in gen.forward_sizes
    assert all(n <= case["num_pred_tokens"] + 1 for n in gen.accept_lengths)
    assert gen.extra["steps"] == len(gen.accept_lengths) == len(gen.extra["match_ngram"])


@pytest.mark.parametrize("occurrence", OCCURRENCES)
def test_prompt_lookup_accepts_lookups_the_target_agrees_with(occurrence):
    """A case (fixed weights) where a lookup is accepted: a step emits 2 tokens for one target forward."""
    pair = pair_for("llama", 0.05)
    prompt = [5, 6, 7, 5, 6, 7, 5, 6]
    ref, _ = greedy_reference(pair, prompt, 60, None)
    gen = PromptLookup(pair, occurrence=occurrence).generate(prompt, 60, set())
    assert gen.tokens == ref.tokens
    assert gen.accepted >= 1 and gen.target_forwards < 60
    assert gen.extra["steps_with_match"] >= gen.accepted


def test_prompt_lookup_samples_above_temperature_zero():
    pair = pair_for("gpt2", 0.05)
    prompt = [5, 6, 7, 8] * 3
    method = PromptLookup(pair, temperature=0.8, seed=3)
    gen = method.generate(prompt, 25, set())
    check_counters(gen, "prompt_lookup", sampled=True)
    method.reset(3)
    assert method.generate(prompt, 25, set()).tokens == gen.tokens  # seeded: reproducible


@pytest.mark.parametrize("settings_, message", [
    ({"max_ngram_size": 0}, "method.max_ngram_size: must be a positive integer"),
    ({"min_ngram_size": 0}, "method.min_ngram_size: must be a positive integer"),
    ({"min_ngram_size": 4, "max_ngram_size": 3}, "method.min_ngram_size: must be <= method.max_ngram_size (3)"),
    ({"num_pred_tokens": 0}, "method.num_pred_tokens: must be a positive integer"),
    ({"num_pred_tokens": True}, "method.num_pred_tokens: must be a positive integer"),
    ({"occurrence": "latest"}, "method.occurrence: must be one of recent, earliest, earliest_whole"),
])
def test_prompt_lookup_rejects_bad_settings(settings_, message):
    with pytest.raises(ConfigError) as caught:
        PromptLookup(pair_for("llama", 0.05), **settings_)
    assert str(caught.value).startswith(message)
