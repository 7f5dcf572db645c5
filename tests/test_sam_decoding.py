"""SAM Decoding: the suffix automaton on hand-built sequences and against a brute-force scan (matches, first
occurrences, the shorter-suffix rule, a static corpus), the proposer's choice between its draft and a fallback's,
output identical to greedy (alone and with a draft-model fallback), caches and distributions exact above T=0, bad
settings and the configs' composition."""
import json
import time

import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from omegaconf import OmegaConf

from specbench.run.components import build, method_as_recorded, needs_draft_model
from specbench.run.config_check import check_components
from specbench.decoding import loop
from specbench.backends.torch.cached_lm import CachedLM
from specbench.decoding.proposal import Proposal, StepContext
from specbench.decoding.sampling import Sampler
from specbench.decoding.suffix_automaton import Match, SuffixAutomaton
from specbench.errors import ConfigError
from specbench.models.heads.names import head_location
from specbench.methods.feature_head import FeatureHeadMethod
from specbench.methods.sam_decoding import SamDecoding, SamProposer
from specbench.methods.sl_policies import HeuristicSL
from specbench.methods.speculative import SpeculativeDecoding
from specbench.methods.token_recycling import TokenRecycling

from .distribution_helpers import one_thread  # noqa: F401  (autouse fixture: one torch thread)
from .distribution_helpers import EOS as SMALL_EOS
from .distribution_helpers import exact_sequence_distribution, goodness_of_fit, sample_generations, small_vocab_pair
from .conftest import run_cli
from .test_config import composed
from .test_counters import check_counters
from .test_equivalence import greedy_reference, pair_for
from .test_feature_heads import random_head
from .test_speculative_sampling import fresh_probs, noisy_pair

EOS = 99
ALPHA = 1e-3


def automaton_of(tokens):
    sam = SuffixAutomaton()
    for token in tokens:
        sam.extend(token)
    return sam


def propose(tokens, max_draft=10, min_match=1, room=100, eos=(EOS,), static=None, bias=0, fallback=None, alpha=None):
    proposer = SamProposer(max_draft, min_match, static, bias, fallback, alpha)
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


def test_with_alpha_the_draft_grows_with_the_match_as_sam_alone_does():
    """Spec-Bench's SAM alone (DynSAM.gen_dyn_draft): n = min(n_predicts, 1 + int(m * alpha)) tokens *counting the
    last committed one*, so min(max_draft, ⌊α·m⌋) drafted; m = 1 -> 4, m = 2 -> 8, capped by max_draft."""
    history = [1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14]
    proposal, proposer = propose(history + [1], alpha=4.0)  # (1) occurs at 0: m = 1
    assert proposer.match_length == [1] and proposal.tokens == [2, 3, 4, 5]
    proposal, proposer = propose(history + [1, 2], alpha=4.0)  # m = 2: 8 tokens
    assert proposer.match_length == [2] and proposal.tokens == [3, 4, 5, 6, 7, 8, 9, 10]
    proposal, _ = propose(history + [1, 2], alpha=4.0, max_draft=6)  # the cap
    assert proposal.tokens == [3, 4, 5, 6, 7, 8]
    proposal, _ = propose(history + [1, 2], alpha=1.5)  # ⌊1.5 · 2⌋ = 3
    assert proposal.tokens == [3, 4, 5]
    proposal, _ = propose(history + [99], alpha=4.0)  # no match: nothing (a plain target step)
    assert proposal.tokens == []
    proposal, _ = propose(history + [1, 2])  # no alpha: max_draft (10) whatever the match
    assert len(proposal.tokens) == 10


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
    "alpha": st.one_of(st.none(), st.sampled_from([0.5, 1.0, 4.0])),
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
                         fallback=fallback, alpha=case["alpha"])
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


def test_sam_decoding_accepts_matches_the_target_agrees_with():
    """A case (fixed weights) where the automaton's drafts are accepted: steps emit several tokens per forward."""
    pair = pair_for("llama", 0.05)
    prompt = [136, 34, 10, 50] * 3  # found by trying a few: here the output repeats what came before
    ref, _ = greedy_reference(pair, prompt, 60, None)
    gen = SamDecoding(pair).generate(prompt, 60, set())
    assert gen.tokens == ref.tokens
    assert gen.accepted >= 5 and gen.target_forwards <= 55 and gen.extra["steps_sam"] >= gen.accepted


def test_sam_over_token_recycling_learns_from_every_step_and_equals_greedy():
    """A Token Recycling fallback learns M from every verify step's top-k rows, the automaton's steps too (its x0
    read from the step, not from a proposal it did not make): before, its observe met no rows and failed."""
    pair = pair_for("llama", 0.05)
    prompt = [136, 34, 10, 50] * 3
    ref, _ = greedy_reference(pair, prompt, 40, None)
    fallback = TokenRecycling(pair, tree=[2, 1], matrix_init="empty")
    gen = SamDecoding(pair, fallback=fallback, min_match_length=3).generate(prompt, 40, set())
    assert gen.tokens == ref.tokens
    assert gen.extra["steps_sam"] > 0 and gen.extra["steps_fallback"] > 0
    # the last step's x0 (whoever drafted) wrote its row: the target's top-2 after it, the emitted token first
    first_of_last_step = len(prompt) + len(gen.tokens) - gen.accept_lengths[-1]
    committed = prompt + gen.tokens
    assert fallback.matrix.candidates(committed[first_of_last_step - 1])[0] == committed[first_of_last_step]


# -- above temperature 0 --------------------------------------------------------------------------------------------

@pytest.mark.parametrize("arch", ["llama", "gpt2"])
def test_the_fallbacks_draft_cache_catches_up_after_sam_steps(arch, monkeypatch):
    """Record every verification (the proposal, q when the fallback drafted it, p); the first step is the
    automaton's (the prompt repeats), so the draft model reads the prompt only on a later step: every q and p must
    equal a fresh full forward on the committed sequence, and the draft's cache a prefix of it at the end."""
    pair = noisy_pair(arch)
    steps, lms = [], []
    real_verify, real_init = loop.verify_tree_sampling, CachedLM.__init__

    def recording_verify(proposal, target_probs, sampler):
        path, nxt = real_verify(proposal, target_probs, sampler)
        probs = None if proposal.probs is None else proposal.probs.clone()
        steps.append((list(proposal.tokens), probs, target_probs.clone(), len(path), nxt))
        return path, nxt

    def recording_init(self, *args, **kwargs):
        real_init(self, *args, **kwargs)
        lms.append(self)

    monkeypatch.setattr(loop, "verify_tree_sampling", recording_verify)
    monkeypatch.setattr(CachedLM, "__init__", recording_init)
    prompt = [17, 42, 99, 100, 5] * 3
    method = SamDecoding(pair, max_draft=4, min_match_length=1, temperature=1.0,
                         fallback=SpeculativeDecoding(pair, "speculative", gamma=3, temperature=1.0))
    method.reset(7)
    gen = method.generate(prompt, 40, set())
    source = gen.extra["source"]
    assert source[0] == "sam" and "fallback" in source
    sampler = Sampler(1.0, 1.0)
    committed = list(prompt)
    for (draft, q, p, n, nxt), by in zip(steps, source):
        assert torch.allclose(p, fresh_probs(pair.target, sampler, committed + draft, len(draft) + 1), atol=1e-5)
        assert (q is not None) == (by == "fallback" and bool(draft))  # SAM's drafts are point masses
        if q is not None:
            want_q = fresh_probs(pair.draft, sampler, committed + draft[:-1], len(draft))
            assert torch.allclose(q, want_q, atol=1e-5), f"draft distributions wrong after {len(committed)} tokens"
        committed += draft[:n] + [nxt]
    assert gen.tokens == committed[len(prompt):]
    draft_lm = next(lm for lm in lms if lm.model is pair.draft)
    assert draft_lm.length <= len(committed) - 1
    continued = sampler.probs(draft_lm.forward(committed[draft_lm.length:])[-1:])
    assert torch.allclose(continued, fresh_probs(pair.draft, sampler, committed, 1), atol=1e-5)


SMALL_PROMPT = [1, 2, 4, 1, 2, 4, 1, 2]  # repeats: the automaton drafts (4, 1) first, the fallback after a mismatch
SMALL_MAX_NEW = 3


@pytest.fixture(scope="module")
def small_pair():
    return small_vocab_pair()


def sam_method(pair, with_fallback: bool, temperature: float):
    fallback = SpeculativeDecoding(pair, "speculative", gamma=2, temperature=temperature) if with_fallback else None
    return SamDecoding(pair, max_draft=3, min_match_length=2, fallback=fallback, temperature=temperature)


@pytest.mark.parametrize("with_fallback", [False, True])
def test_generations_are_distributed_as_the_targets(small_pair, with_fallback):
    """3000 generations of at most 3 tokens over a 6-token vocabulary (EOS included) against the target's exact
    distribution over all of them: SAM's point-mass chains and, with the fallback, the draft model's sampled ones
    with their q."""
    target = exact_sequence_distribution(small_pair.target, 1.0, 1.0, SMALL_PROMPT, SMALL_MAX_NEW, {SMALL_EOS})
    counts, gens = sample_generations(sam_method(small_pair, with_fallback, 1.0), SMALL_PROMPT, SMALL_MAX_NEW,
                                      {SMALL_EOS}, 3000)
    sources = [by for g in gens for by in g.extra["source"]]
    assert sources.count("sam") > 1000
    assert sources.count("fallback") > 500 if with_fallback else "fallback" not in sources
    assert 0 < sum(g.accepted for g in gens) < sum(g.drafted for g in gens)  # acceptances and rejections
    assert goodness_of_fit(counts, target) > ALPHA


def test_distribution_test_detects_a_verifier_that_trusts_point_masses(small_pair, monkeypatch):
    """Power check of the test above: a verifier that accepts every point-mass draft token unchecked (as if q = p)
    is rejected with 1500 generations."""
    real = loop.verify_tree_sampling

    def trusting(proposal, target_probs, sampler):
        if proposal.probs is None and proposal.tokens:
            return list(range(len(proposal.tokens))), sampler.sample(target_probs[len(proposal.tokens)])
        return real(proposal, target_probs, sampler)

    monkeypatch.setattr(loop, "verify_tree_sampling", trusting)
    target = exact_sequence_distribution(small_pair.target, 1.0, 1.0, SMALL_PROMPT, SMALL_MAX_NEW, {SMALL_EOS})
    counts, _ = sample_generations(sam_method(small_pair, True, 1.0), SMALL_PROMPT, SMALL_MAX_NEW, {SMALL_EOS}, 1500)
    assert goodness_of_fit(counts, target) < ALPHA


def test_sam_decoding_samples_reproducibly_above_temperature_zero():
    pair = pair_for("gpt2", 0.05)
    prompt = [5, 6, 7, 8] * 3
    method = SamDecoding(pair, temperature=0.8, seed=3,
                         fallback=SpeculativeDecoding(pair, "speculative", gamma=2, temperature=0.8, seed=3))
    gen = method.generate(prompt, 25, set())
    check_counters(gen, "sam_decoding", sampled=True)
    method.reset(3)
    assert method.generate(prompt, 25, set()).tokens == gen.tokens  # seeded: reproducible


# -- settings and configs -------------------------------------------------------------------------------------------

@pytest.mark.parametrize("settings_, message", [
    ({"max_draft": 0}, "method.max_draft: must be a positive integer"),
    ({"min_match_length": 0}, "method.min_match_length: must be a positive integer"),
    ({"min_match_length": True}, "method.min_match_length: must be a positive integer"),
    ({"corpus_bias": -1}, "method.corpus_bias: must be an integer >= 0"),
    ({"alpha": 0}, "method.alpha: must be null or a number > 0"),
    ({"alpha": "adaptive"}, "method.alpha: must be null or a number > 0"),
    ({"corpus": "/nonexistent/corpus.json"}, "method.corpus: no such file"),
    ({"fallback": "speculative"}, "method.fallback: must be null or a method config with a _target_"),
    ({"fallback": {"gamma": 3}}, "method.fallback: must be null or a method config with a _target_"),
    ({"fallback": {"_target_": "specbench.methods.greedy.Greedy", "name": "greedy"}},
     "method.fallback: must be a method on the speculative loop"),
    ({"fallback": {"_target_": "specbench.methods.speculative.SpeculativeDecoding", "name": "s", "gamma": 0}},
     "method.fallback.gamma: must be a positive integer"),
])
def test_sam_decoding_rejects_bad_settings(settings_, message):
    with pytest.raises(ConfigError) as caught:
        SamDecoding(pair_for("llama", 0.05), **settings_)
    assert str(caught.value).startswith(message) and "\n" not in str(caught.value)


@pytest.mark.parametrize("content", ["not json", '{"a": 1}', "[[1, -2]]", "[[1, true]]", "[1, 2]"])
def test_a_corpus_that_is_not_lists_of_token_ids_is_refused(content, tmp_path):
    path = tmp_path / "corpus.json"
    path.write_text(content)
    with pytest.raises(ConfigError, match="method.corpus: "):
        SamDecoding(pair_for("llama", 0.05), corpus=str(path))


def test_a_corpus_file_builds_the_static_automaton(tmp_path):
    path = tmp_path / "corpus.json"
    path.write_text(json.dumps([[7, 8, 1, 2, 3, 50, 51], [9, 9]]))
    method = SamDecoding(pair_for("llama", 0.05), corpus=str(path), corpus_bias=0, max_draft=4)
    proposer = method.make_proposer([1])
    proposal = proposer.propose(StepContext([40, 7, 8, 1], 0, 100, set(), Sampler()))
    assert proposal.tokens == [2, 3, 50, 51] and proposer.match_length == [3]


def test_the_configs_compose_with_a_nested_fallback(tmp_path):
    alone, combined = composed("method=sam_decoding"), composed("method=sam_speculative")
    assert alone.method.fallback is None and alone.method.name == "sam_decoding"
    assert combined.method.fallback._target_ == "specbench.methods.speculative.SpeculativeDecoding"
    assert combined.method.name == "sam_speculative" and combined.method.min_match_length == 4
    eagle = composed("method=sam_speculative", "method@method.fallback=eagle")
    assert eagle.method.fallback._target_ == "specbench.methods.feature_head.FeatureHeadMethod"
    assert eagle.method.name == "sam_eagle"
    named = composed("method=sam_eagle")  # Spec-Bench's SAM-Decoding[EAGLE-2] row as one method (sweepable)
    assert OmegaConf.to_container(named.method, resolve=True) == OmegaConf.to_container(eagle.method,
                                                                                      resolve=True)
    assert composed("method=sam_speculative", "method.fallback.gamma=6").method.fallback.gamma == 6
    # the draft model loads for a fallback that drafts with it, not for SAM alone or SAM[EAGLE-2]
    assert needs_draft_model(combined) and not needs_draft_model(alone) and not needs_draft_model(eagle)
    # the nested method is checked like a top-level one (pair and sampling are passed to it, never configured)
    records = f"runner.records_dir={tmp_path}"
    check_components(composed("method=sam_speculative", "model=tiny_llama", records))
    with pytest.raises(ConfigError, match=r"^method\.fallback\.gamma: must be a positive integer"):
        check_components(composed("method=sam_speculative", "model=tiny_llama", "method.fallback.gamma=0"))
    with pytest.raises(ConfigError, match=r"^method\.fallback\.gama: unknown key"):
        check_components(composed("method=sam_speculative", "model=tiny_llama", "+method.fallback.gama=3"))
    with pytest.raises(ConfigError, match=r"^method\.fallback\.pair: not a method\.fallback setting"):
        check_components(composed("method=sam_speculative", "model=tiny_llama", "+method.fallback.pair=x"))
    pair = build(composed("model=tiny_llama").model, "model")
    built = build(combined.method, "method", pair=pair, temperature=0.0, top_p=1.0, seed=0)
    assert isinstance(built.fallback, SpeculativeDecoding) and built.needs_draft


eagle_cases = st.fixed_dictionaries({
    "prompt": st.lists(st.integers(3, 258), min_size=1, max_size=8),
    "repeat": st.integers(1, 3),
    "max_draft": st.integers(1, 6),
    "min_match_length": st.integers(1, 3),
    "max_new_tokens": st.integers(1, 30),
    "eos_pick": st.one_of(st.none(), st.integers(0, 29)),
})


@pytest.fixture(scope="module")
def eagle_head(tmp_path_factory):
    return random_head(pair_for("llama", 0.05), "eagle", tmp_path_factory.mktemp("eagle"), std=0.3)


@settings(max_examples=20, deadline=None, suppress_health_check=[HealthCheck.too_slow,
                                                                 HealthCheck.function_scoped_fixture])
@given(case=eagle_cases)
def test_sam_with_an_eagle_fallback_equals_greedy(case, eagle_head):
    """SAM[EAGLE-2]: the target verifies as a FeatureLM, and the head's features follow every step, including
    those the automaton drafted (HeadTree refuses to draft with features missing)."""
    pair = pair_for("llama", 0.05)
    prompt = case["prompt"] * case["repeat"]
    ref, eos = greedy_reference(pair, prompt, case["max_new_tokens"], case["eos_pick"])
    eagle = FeatureHeadMethod(pair, "eagle", head=eagle_head, top_k=3, depth=3, max_nodes=8)
    method = SamDecoding(pair, "sam_eagle", max_draft=case["max_draft"],
                         min_match_length=case["min_match_length"], fallback=eagle)
    gen = method.generate(prompt, case["max_new_tokens"], eos)
    assert gen.tokens == ref.tokens
    check_counters(gen, "sam_eagle")
    assert gen.draft_forwards == 0  # a head, not a draft model: its forwards are in the fallback's counters
    fallback_steps = [i for i, by in enumerate(gen.extra["source"]) if by == "fallback"]
    assert len(gen.extra["fallback"]["tree_nodes"]) == len(fallback_steps)


def test_sam_with_an_eagle_fallback_drafts_from_both(eagle_head):
    """A fixed case where the head drafts after steps the automaton drafted (its features then caught up)."""
    pair = pair_for("llama", 0.05)
    prompt = [136, 34, 10, 50] * 3
    ref, _ = greedy_reference(pair, prompt, 40, None)
    eagle = FeatureHeadMethod(pair, "eagle", head=eagle_head, top_k=3, depth=3, max_nodes=8)
    gen = SamDecoding(pair, "sam_eagle", min_match_length=2, fallback=eagle).generate(prompt, 40, set())
    assert gen.tokens == ref.tokens
    source = gen.extra["source"]
    assert source[0] == "sam" and "fallback" in source
    assert any(a == "sam" and b == "fallback" for a, b in zip(source[1:], source[2:]))


def test_a_corpus_outside_the_pairs_vocabulary_and_an_auto_fallback_length_are_refused(tmp_path):
    pair = pair_for("llama", 0.05)
    path = tmp_path / "corpus.json"
    path.write_text(json.dumps([[1, 2], [pair.vocab_size]]))
    with pytest.raises(ConfigError, match=rf"method.corpus: holds token id {pair.vocab_size}, but the pair's"):
        SamDecoding(pair, corpus=str(path))
    with pytest.raises(ConfigError, match="method.fallback: a proposal length of auto is not tuned"):
        SamDecoding(pair, fallback=SpeculativeDecoding(pair, "speculative", gamma="auto"))


def test_a_fallbacks_carried_state_is_the_methods():
    pair = pair_for("llama", 0.05)
    assert not SamDecoding(pair).carries_state
    assert not SamDecoding(pair, fallback=SpeculativeDecoding(pair, "speculative", gamma=2)).carries_state
    policy = HeuristicSL(initial=3, persistent=True)
    method = SamDecoding(pair, fallback=SpeculativeDecoding(pair, "dyn_heur", policy=policy))
    assert method.carries_state
    method.generate([5, 6, 7, 8], 20, set())
    state = method.carried_state()
    assert state == policy.carried_state()
    method.restore_state(None)
    assert method.carried_state() != state or state == HeuristicSL(initial=3).carried_state()


def test_the_cli_runs_sam_speculative_and_refuses_a_bad_fallback_key_before_loading(tmp_path):
    records = tmp_path / "records"
    proc = run_cli("method=sam_speculative", "data=gsm8k", "data.limit=2", "data.max_new_tokens=16",
                   records_dir=records)
    lines = [json.loads(line) for path in records.rglob("*.jsonl") for line in path.read_text().splitlines()]
    ours = [r for r in lines if r.get("method") == "sam_speculative"]
    assert ours and all({"steps", "steps_sam", "source", "fallback"} <= set(r["extra"]) for r in ours), proc.stdout
    proc = run_cli("method=sam_speculative", "method.fallback.gamma=0", "data=gsm8k", "data.limit=1",
                   records_dir=tmp_path / "bad", check=False)
    assert proc.returncode == 2 and "method.fallback.gamma: must be a positive integer" in proc.stderr
    assert "Loading" not in proc.stderr


def test_a_long_prompt_and_a_long_loop_cost_little_per_step():
    prompt = [(i * 7919) % 5000 for i in range(20000)] + [7] * 2000  # a long text, then a loop of period 1
    proposer = SamProposer(10, 1)
    tokens = list(prompt)
    seconds = []  # the first step (reads the prompt into the automaton), then the other 499 together
    start = time.perf_counter()
    for step in range(500):
        if step == 1:
            seconds.append(time.perf_counter() - start)
            start = time.perf_counter()
        proposal = proposer.propose(StepContext(tokens, step, 1000, set(), Sampler()))
        assert len(proposer.sam.tokens) == len(tokens)  # every committed token read once, never rescanned
        tokens += proposal.tokens[:1] + [step % 5000]
    seconds.append(time.perf_counter() - start)
    # against the same process's own reading of the prompt (a busy machine slows both): 499 steps cost ~0.3x it
    # here; rescanning the 22k tokens per step would cost ~500x
    assert seconds[1] < 50 * seconds[0], seconds


def test_sam_eagles_run_key_names_the_heads_weights(tmp_path):
    """SAM[EAGLE-2] is recorded with its fallback's head by location and sha256, as method=eagle is."""
    cfg = composed("method=sam_speculative", "method@method.fallback=eagle", f"paths.heads={tmp_path}",
                   "model=tiny_llama")
    method = OmegaConf.to_container(cfg.method, resolve=True)
    random_head(pair_for("llama", 0.05), "eagle", head_location(method["fallback"]["head"],
                                                                 method["fallback"]["heads_dir"]))
    recorded = method_as_recorded(method)
    assert recorded["fallback"]["head_sha256"] and "heads_dir" not in recorded["fallback"]
    assert recorded["fallback"]["head_sha256"] == method_as_recorded(method["fallback"])["head_sha256"]
    plain = OmegaConf.to_container(composed("method=sam_speculative").method, resolve=True)
    assert method_as_recorded(plain) == plain  # nothing to add: the run key is unchanged
