"""Suffix decoding: the suffix tree on hand-built sequences (counts, depth cap, incremental insertion and removal
against brute-force counting), the frequency-ordered speculation (order, probabilities, the probability floor, the
room, EOS, path mode), the adaptive size and the choice of match and tree, the global tree's FIFO cap and warm-start
snapshots; output identical to greedy at T = 0 and distributed as the target's above it."""
import time
from collections import Counter

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from specbench.decoding import loop
from specbench.decoding.proposal import StepContext
from specbench.decoding.sampling import Sampler
from specbench.decoding.suffix_tree import SuffixTree, speculate
from specbench.errors import ConfigError
from specbench.methods.suffix import SuffixDecoding, SuffixProposer

from .distribution_helpers import EOS, exact_sequence_distribution, goodness_of_fit, sample_generations
from .distribution_helpers import small_vocab_pair
from .test_counters import check_counters
from .test_equivalence import greedy_reference, pair_for
from .test_tree_sampling import ALPHA, WALK, flawed_verifier, record_trees


def dump(tree: SuffixTree) -> dict[tuple[int, ...], int]:
    """Every path of the tree with its count."""
    out, stack = {}, [((), tree.root)]
    while stack:
        path, node = stack.pop()
        for token, child in (node.children or {}).items():
            out[path + (token,)] = child.count
            stack.append((path + (token,), child))
    return out


def brute_counts(sequences, depth: int) -> dict[tuple[int, ...], int]:
    """Occurrences of every substring of at most ``depth`` tokens, counted by a scan."""
    counts = Counter()
    for seq in sequences:
        for end in range(len(seq)):
            for n in range(1, min(depth, end + 1) + 1):
                counts[tuple(seq[end + 1 - n:end + 1])] += 1
    return dict(counts)


# -- the tree --------------------------------------------------------------------------------------------------------

def test_counts_are_occurrences_and_the_depth_is_capped():
    tree = SuffixTree(3)
    tree.add([1, 2, 1, 2, 3])
    assert dump(tree) == {(1,): 2, (2,): 2, (3,): 1, (1, 2): 2, (2, 1): 1, (2, 3): 1,
                          (1, 2, 1): 1, (2, 1, 2): 1, (1, 2, 3): 1}  # no 4-token path: D = 3
    assert tree.nodes == 9
    assert tree.match([5, 1, 2], 2) is tree.root.children[1].children[2]
    assert tree.match([5, 1, 2], 3) is None


@settings(max_examples=200, deadline=None)
@given(seqs=st.lists(st.lists(st.integers(0, 3), max_size=30), min_size=1, max_size=3), depth=st.integers(1, 6),
       cuts=st.lists(st.integers(0, 30), max_size=4))
def test_incremental_insertion_and_removal_count_what_a_scan_counts(seqs, depth, cuts):
    tree = SuffixTree(depth)
    for seq in seqs:  # each sequence appended in chunks, as a generation grows
        active, start = tree.start(), 0
        for cut in sorted(set(cuts) | {len(seq)}):
            active = tree.extend(active, seq[start:max(start, cut)])
            start = max(start, cut)
    assert dump(tree) == brute_counts(seqs, depth)
    assert tree.nodes == len(dump(tree))
    tree.remove(seqs[0])
    assert dump(tree) == brute_counts(seqs[1:], depth)
    assert tree.nodes == len(dump(tree))


def test_a_long_prompt_is_inserted_once_not_rebuilt_per_step():
    pair = pair_for("llama", 0.05)
    prompt = [(i * 7919) % 5000 for i in range(20000)]
    method = SuffixDecoding(pair, max_cached_requests=0)
    tokens = list(prompt)
    start = time.perf_counter()
    proposer = method.make_proposer(prompt)
    seconds = []  # building the prompt's tree and the first step, then the other 299 steps together
    for step in range(300):
        if step == 1:
            seconds.append(time.perf_counter() - start)
            start = time.perf_counter()
        proposal = proposer.propose(StepContext(tokens, step, 1000, set(), Sampler()))
        kept = proposal.tokens[:1] + [step % 5000]
        tokens += kept
        proposer.local_active = proposer.local.extend(proposer.local_active, kept)
    seconds.append(time.perf_counter() - start)
    assert proposer.local.nodes <= len(tokens) * method.max_depth
    # against the same process's own build of the prompt's tree (a busy machine slows both): 299 steps cost ~0.01x
    # it here; rebuilding the 20k x 24 nodes per step would cost ~300x
    assert seconds[1] < 30 * seconds[0], seconds


# -- speculation -----------------------------------------------------------------------------------------------------

# after 7: 8 three times (then 9 twice, 4 once, each then 0), 5 once (then 0)
BRANCHY = [7, 8, 9, 0, 7, 8, 9, 0, 7, 8, 4, 0, 7, 5, 0]


def grow(max_tokens=100, min_prob=0.0, room=100, eos=(), tree=True):
    suffixes = SuffixTree(4)
    suffixes.add(BRANCHY)
    draft = speculate(suffixes.match([7], 1), max_tokens, min_prob, room, set(eos), tree)
    return draft.tokens, draft.parents, draft.probs


def test_the_most_probable_frontier_node_is_expanded_first():
    # p = product of count(child) / count(parent): 8: 3/4, 8-9: 3/4 * 2/3, 5: 1/4, 8-4: 3/4 * 1/3, ...
    assert grow() == ([8, 9, 0, 5, 4, 0, 0], [-1, 0, 1, -1, 0, 3, 4], [0.75, 0.5, 0.5, 0.25, 0.25, 0.25, 0.25])
    assert grow(max_tokens=4)[:2] == ([8, 9, 0, 5], [-1, 0, 1, -1])
    assert grow(min_prob=0.3)[:2] == ([8, 9, 0], [-1, 0, 1])  # nothing below the floor
    assert grow(tree=False)[:2] == ([8, 9, 0], [-1, 0, 1])  # path mode: the most frequent child each time


def test_nothing_grows_past_the_room_or_under_an_eos():
    assert grow(room=2)[:2] == ([8, 9, 5, 4, 0], [-1, 0, -1, 0, 2])
    assert grow(eos=(9,))[:2] == ([8, 9, 5, 4, 0, 0], [-1, 0, -1, 0, 2, 3])
    assert grow(room=0)[0] == []


PROMPT = [10, 11, 12, 13, 14, 15, 16, 17, 0, 12, 13]  # (13) and (12, 13) occurred before, followed by 14 15 ...


def propose(method, tokens, prompt=None, room=100, eos=()):
    proposer = method.make_proposer(list(prompt if prompt is not None else tokens))
    proposal = proposer.propose(StepContext(list(tokens), 0, room, set(eos), Sampler()))
    assert proposal.probs is None  # point masses
    return proposal.tokens, proposer


def test_the_draft_size_adapts_to_the_match_length():
    pair = pair_for("llama", 0.05)
    # m = 1: (13) seen twice, once followed by 14: p 1/2, at most ⌊α·1⌋ nodes; m = 2: (12, 13) likewise, ⌊α·2⌋
    tokens, proposer = propose(SuffixDecoding(pair, max_cached_requests=0), PROMPT)
    assert tokens == [14, 15] and proposer.match_len == [2]  # score 1.0 (m = 2) beats 0.5 (m = 1)
    tokens, proposer = propose(SuffixDecoding(pair, max_spec_factor=0.5, max_cached_requests=0), PROMPT)
    assert tokens == [14] and proposer.match_len == [2]  # m = 1 earns ⌊0.5⌋ = 0 nodes
    tokens, _ = propose(SuffixDecoding(pair, max_spec_factor=3, max_cached_requests=0), PROMPT)
    assert tokens == [14, 15, 16, 17, 0, 12]
    tokens, _ = propose(SuffixDecoding(pair, max_spec_factor=3, max_tree_nodes=4, max_cached_requests=0), PROMPT)
    assert tokens == [14, 15, 16, 17]  # the cap
    tokens, _ = propose(SuffixDecoding(pair, max_spec_factor=3, max_depth=5, max_cached_requests=0), PROMPT)
    assert tokens == [14, 15, 16]  # match (12, 13) + draft <= D = 5
    tokens, proposer = propose(SuffixDecoding(pair, min_match=3, max_cached_requests=0), PROMPT)
    assert tokens == [] and proposer.match_len == [0] and proposer.stats["steps_with_match"] == 0
    assert propose(SuffixDecoding(pair, max_cached_requests=0), PROMPT, room=1)[0] == [14]


def test_the_global_tree_drafts_what_earlier_outputs_continued_with():
    pair = pair_for("llama", 0.05)
    method = SuffixDecoding(pair)
    method.restore_state(((12, 13, 99, 98),))  # an earlier output: 12 13 was followed by 99 98
    tokens, proposer = propose(method, PROMPT)
    assert tokens == [99, 98] and proposer.match_len == [2]  # score 2 beats the prompt's 14 15 (1/2 each)
    assert proposer.stats["global_hits"] == 1
    method.restore_state(((12, 13, 99, 98),))
    tokens, proposer = propose(method, PROMPT + [99], prompt=PROMPT)  # the prompt tree lacks 99
    assert tokens == [98] and proposer.match_len == [3]  # (99), (13 99), (12 13 99) all score 1: the longest
    assert propose(SuffixDecoding(pair, max_cached_requests=0), PROMPT + [99], prompt=PROMPT)[0] == []


def test_the_global_tree_keeps_the_newest_outputs_and_restores_snapshots():
    pair = pair_for("llama", 0.05)
    prompts = [[5, 6, 7, 8, 9, 5, 6, 7], [30, 31, 32, 30, 31], [40, 41, 40, 41, 40]]
    method = SuffixDecoding(pair, max_cached_requests=2)
    outputs, states = [], [method.carried_state()]
    for prompt in prompts:
        outputs.append(tuple(method.generate(prompt, 12, set()).tokens))
        states.append(method.carried_state())
    assert list(states[3]) == outputs[1:]  # FIFO: the oldest output went
    assert dump(method.global_tree) == brute_counts(outputs[1:], method.max_depth)
    for i in (1, 3, 0, 2, 2):  # back, forth, empty, and a no-op restore
        method.restore_state(states[i])
        assert dump(method.global_tree) == brute_counts(states[i], method.max_depth)
        assert method.carried_state() == states[i]
    assert method.carries_state and not SuffixDecoding(pair, max_cached_requests=0).carries_state


# -- whole generations -----------------------------------------------------------------------------------------------

cases = st.fixed_dictionaries({
    "arch": st.sampled_from(["llama", "gpt2"]),
    "prompt": st.lists(st.integers(3, 258), min_size=1, max_size=10),
    "repeat": st.integers(1, 3),
    "max_depth": st.integers(2, 8),
    "max_spec_factor": st.sampled_from([0.5, 1.0, 2.0, 4.0]),
    "max_tree_nodes": st.integers(1, 8),
    "min_token_prob": st.sampled_from([0.0, 0.1, 0.3]),
    "min_match": st.integers(1, 2),
    "tree": st.booleans(),
    "max_cached_requests": st.sampled_from([0, 1, 5]),
    "max_new_tokens": st.integers(1, 40),
    "eos_pick": st.one_of(st.none(), st.integers(0, 39)),
})


@settings(max_examples=30, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(case=cases)
def test_suffix_equals_greedy(case):
    pair = pair_for(case["arch"], 0.05)
    prompt = case["prompt"] * case["repeat"]
    ref, eos = greedy_reference(pair, prompt, case["max_new_tokens"], case["eos_pick"])
    knobs = {k: case[k] for k in ("max_depth", "max_spec_factor", "max_tree_nodes", "min_token_prob", "tree",
                                  "max_cached_requests")}
    method = SuffixDecoding(pair, min_match=min(case["min_match"], case["max_depth"] - 1), **knobs)
    for _ in range(2):  # the second time the global tree holds the first output
        gen = method.generate(prompt, case["max_new_tokens"], eos)
        assert gen.tokens == ref.tokens
        check_counters(gen, "suffix")
        assert gen.target_forwards == len(gen.accept_lengths) and gen.draft_forwards == 0
        assert gen.extra["steps"] == len(gen.accept_lengths) == len(gen.extra["match_len"])
        assert all(n <= case["max_tree_nodes"] for n in gen.extra["tree_nodes"])
        assert all(n <= min(case["max_tree_nodes"], case["max_depth"] - 1) + 1 for n in gen.accept_lengths)
    assert len(method.entries) == min(2, case["max_cached_requests"])


def test_suffix_accepts_drafts_the_target_agrees_with():
    pair = pair_for("llama", 0.05)
    prompt = [5, 6, 7, 8, 9, 5, 6, 7]
    ref, _ = greedy_reference(pair, prompt, 60, None)
    method = SuffixDecoding(pair)
    method.generate(prompt, 60, set())
    gen = method.generate(prompt, 60, set())  # the same request again: the global tree holds its answer
    assert gen.tokens == ref.tokens and gen.accepted >= 40 and gen.target_forwards <= 20
    assert gen.extra["global_hits"] >= 1


def test_suffix_samples_above_temperature_zero():
    pair = pair_for("gpt2", 0.05)
    prompt = [5, 6, 7, 8] * 3
    method = SuffixDecoding(pair, temperature=0.8, seed=3)
    gen = method.generate(prompt, 25, set())
    check_counters(gen, "suffix", sampled=True)
    method.reset(3)
    method.restore_state(None)
    assert method.generate(prompt, 25, set()).tokens == gen.tokens  # seeded, same state: reproducible


def sampling_method(pair, **settings_):
    return SuffixDecoding(pair, max_depth=4, max_spec_factor=3.0, max_tree_nodes=6, min_token_prob=0.05,
                          max_cached_requests=20, **settings_)


@pytest.mark.parametrize("temperature, top_p", [(1.0, 1.0), (0.9, 0.95)])
def test_generations_are_distributed_as_the_targets(monkeypatch, temperature, top_p):
    """3000 generations of at most 3 tokens against the target's exact distribution; the global tree carries over
    from one to the next (any state leaves each output distributed as the target's, so they stay independent)."""
    pair = small_vocab_pair()
    stats = record_trees(monkeypatch)
    counts, gens = sample_generations(sampling_method(pair, temperature=temperature, top_p=top_p), WALK, 3, {EOS},
                                      3000)
    assert stats["point_masses"] == stats["steps"] == sum(g.target_forwards for g in gens)
    assert sum(g.accepted for g in gens) > 300
    assert stats["branching"] > 1000 and stats["later_sibling_accepted"] > 100, stats
    target = exact_sequence_distribution(pair.target, temperature, top_p, WALK, 3, {EOS})
    assert goodness_of_fit(counts, target) > ALPHA


def test_generation_test_detects_a_flawed_verifier(monkeypatch):
    pair = small_vocab_pair()
    monkeypatch.setattr(loop, "verify_tree_sampling", flawed_verifier("keep_rejected"))
    counts, _ = sample_generations(sampling_method(pair, temperature=1.0), WALK, 3, {EOS}, 1500)
    target = exact_sequence_distribution(pair.target, 1.0, 1.0, WALK, 3, {EOS})
    assert goodness_of_fit(counts, target) < ALPHA


@pytest.mark.parametrize("settings_, message", [
    ({"max_depth": 0}, "method.max_depth: must be a positive integer"),
    ({"max_depth": 1}, "method.max_depth: must be >= 2"),
    ({"max_spec_factor": 0}, "method.max_spec_factor: must be a number > 0"),
    ({"max_spec_factor": "x"}, "method.max_spec_factor: must be a number > 0"),
    ({"max_tree_nodes": 0}, "method.max_tree_nodes: must be a positive integer"),
    ({"min_token_prob": 1.5}, "method.min_token_prob: must be a number in [0, 1]"),
    ({"min_match": 0}, "method.min_match: must be a positive integer"),
    ({"min_match": 24}, "method.min_match: must be < method.max_depth (24)"),
    ({"tree": "yes"}, "method.tree: must be true or false"),
    ({"max_cached_requests": -1}, "method.max_cached_requests: must be an integer >= 0"),
])
def test_suffix_rejects_bad_settings(settings_, message):
    with pytest.raises(ConfigError) as caught:
        SuffixDecoding(pair_for("llama", 0.05), **settings_)
    assert str(caught.value).startswith(message) and "\n" not in str(caught.value)


def test_proposer_type():
    assert isinstance(SuffixDecoding(pair_for("llama", 0.05)).make_proposer([1, 2]), SuffixProposer)
