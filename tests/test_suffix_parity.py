"""Suffix decoding against the reference: Snowflake's Arctic Inference (``arctic_inference.suffix_decoding``, what
vLLM and SGLang ship), built from its source package by ``make install``. For the same history — earlier requests'
outputs in the global tree, this request's prompt and output in its own — and the same settings, our proposer must
draft what ``SuffixDecodingCache.speculate`` drafts: the same match length, the same nodes with the same estimated
probabilities, the same score; path mode (Arctic's and vLLM's default) and tree mode (the paper's).

Where a draft is cut by its budget, or a path mode step chooses between children of equal counts, the reference's
choice among equals is an implementation detail (its priority queue and child order): there the test compares what
does not depend on it (the score, the match length, the multiset of probabilities). Where two drafts tie in score,
rounding picks one (float32 there, float64 here): only the best score is compared. Path mode where the most frequent
children of a node tie is compared in full: both follow the child Arctic's siblings list puts first (its moves on each
count change, which decoding/suffix_tree.regroup repeats). With a cap on the cached requests, the earlier requests
past it are evicted first in, first out, on both sides, and their counts go down again (Arctic's ``remove``: a
node counted down goes to the head of its new count's siblings): the same comparisons after evictions."""
import os

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from specbench.decoding.proposal import StepContext
from specbench.decoding.sampling import Sampler
from specbench.methods.suffix import SuffixDecoding

from .test_equivalence import pair_for

try:
    from arctic_inference.suffix_decoding import SuffixDecodingCache
except ImportError:  # make install builds it; CI (make test) must have it
    if os.environ.get("SPECBENCH_REFERENCES") == "required":
        raise
    pytest.skip("arctic-inference is not installed (make install builds it from its source package)",
                allow_module_level=True)

UNCAPPED = 10_000  # a budget no draft reaches: the whole tree above the probability floor
# the reference keeps probabilities in float32, ours in float64: they agree to float32's precision


def paths(tokens: list[int], parents: list[int]) -> dict[tuple[int, ...], int]:
    """Each node's token path from the matched node, as {path: node index} (parents come before children)."""
    path_of: list[tuple[int, ...]] = []
    for token, parent in zip(tokens, parents):
        path_of.append((*(path_of[parent] if parent >= 0 else ()), token))
    return {path: i for i, path in enumerate(path_of)}


def reference_draft(previous, prompt, output, depth, budget, factor, floor, tree, cap=-1):
    cache = SuffixDecodingCache(max_tree_depth=depth, max_cached_requests=cap)
    for i, (p, r) in enumerate(previous):
        cache.start_request(f"earlier-{i}", p)
        if r:
            cache.add_active_response(f"earlier-{i}", r)
        cache.stop_request(f"earlier-{i}")
    cache.start_request("now", prompt)
    if output:
        cache.add_active_response("now", output)
    context = (prompt + output)[-depth:]
    return cache.speculate("now", context, max_spec_tokens=budget, max_spec_factor=factor, max_spec_offset=0.0,
                           min_token_prob=floor, use_tree_spec=tree)


def our_draft(pair, previous, prompt, output, depth, budget, factor, floor, tree, cap=-1):
    method = SuffixDecoding(pair, max_depth=depth, max_spec_factor=factor, max_tree_nodes=budget,
                            min_token_prob=floor, tree=tree, max_cached_requests=cap if cap > 0 else 10 ** 6)
    for p, r in previous:  # an earlier request: its output enters the global tree, its prompt does not
        earlier = method.make_proposer(p)
        method.append_output(earlier.entry, r)
    proposer = method.make_proposer(prompt)
    proposer.local_active = proposer.local.extend(proposer.local_active, output)
    method.append_output(proposer.entry, output)
    context = StepContext(prompt + output, 0, 10 ** 6, set(), Sampler())
    draft, _ = proposer.choose(context)
    return draft, [d for _, tree in proposer.trees() for d in proposer.drafts(tree, context)]  # every candidate


tokens = st.lists(st.integers(0, 4), max_size=24)
cases = st.fixed_dictionaries({
    "previous": st.lists(st.tuples(tokens, tokens), max_size=3),
    "prompt": st.lists(st.integers(0, 4), min_size=1, max_size=24),
    "output": tokens,
    "depth": st.sampled_from([3, 6, 64]),
    "budget": st.sampled_from([1, 3, 8, UNCAPPED]),
    "factor": st.sampled_from([0.5, 1.0, 2.0, 64.0]),
    "floor": st.sampled_from([0.0, 0.1, 0.3]),
    "tree": st.booleans(),
})


@settings(max_examples=400, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(case=cases)
def test_our_draft_is_arctic_inferences(case):
    pair = pair_for("llama", 0.05)
    assert_same_draft(case, reference_draft(**case), *our_draft(pair, **case))


few = st.lists(st.integers(0, 2), max_size=12)  # three tokens: ties between siblings, which order decides, are common
evicting = cases.flatmap(lambda case: st.fixed_dictionaries({
    **{key: st.just(value) for key, value in case.items() if key not in ("previous", "prompt", "tree")},
    "tree": st.sampled_from([False, False, True]),  # path mode, where the siblings' order decides, twice as often
    "previous": st.lists(st.tuples(few, few), min_size=3, max_size=5),  # some evicted, some kept
    "prompt": st.lists(st.integers(0, 2), min_size=1, max_size=12),
    "cap": st.integers(2, 3),
}))


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(case=evicting)
def test_after_evictions_our_draft_is_still_arctic_inferences(case):
    """More earlier requests than the cache holds (with the request itself): the oldest are evicted, their counts
    taken out of the global tree again, on both sides."""
    pair = pair_for("llama", 0.05)
    assert_same_draft(case, reference_draft(**case), *our_draft(pair, **case))


def test_an_evicted_request_no_longer_drafts():
    """Hand-built: request 0's output 1 3 1 3, request 1's 1 4 1 2 1 2. After 1 the global tree counts 3 and 2 twice
    each, 3 first (2 reached two from behind 4, to the tail of the 2s), so path mode drafts 3. With a cap of two
    requests, request 2 evicts request 0: 3 is counted down to nothing, and path mode drafts 2."""
    pair = pair_for("llama", 0.05)
    previous = [([9], [1, 3, 1, 3]), ([9], [1, 4, 1, 2, 1, 2])]
    for cap, first in ((-1, 3), (2, 2)):
        args = (previous, [5, 1], [], 64, UNCAPPED, 64.0, 0.0, False, cap)
        ref, (ours, _) = reference_draft(*args), our_draft(pair, *args)
        assert ref.token_ids[0] == first and ours.tokens == ref.token_ids
        assert ours.probs == pytest.approx(ref.probs)


def test_a_child_counted_down_by_an_eviction_heads_its_new_count():
    """Hand-built: request 0's output 1 2, request 1's 1 3 1 2: after 1, 2 is counted twice and 3 once. Evicting
    request 0 counts 2 down to one, beside 3: Arctic moves a node counted down to the head of its new count's
    siblings, so path mode drafts 2 (a node counted down to the tail would leave 3 first)."""
    pair = pair_for("llama", 0.05)
    args = ([([9], [1, 2]), ([9], [1, 3, 1, 2])], [5, 1], [], 64, UNCAPPED, 64.0, 0.0, False, 2)
    ref, (ours, _) = reference_draft(*args), our_draft(pair, *args)
    assert ref.token_ids[0] == 2 and ours.tokens == ref.token_ids and ours.probs == pytest.approx(ref.probs)


def assert_same_draft(case, ref, ours, candidates):
    assert bool(ours.tokens) == bool(ref.token_ids), (ours, ref)
    if not ours.tokens:
        return
    # the best score, whatever breaks ties (the reference sums its float32 probabilities: 1e-6 per ~10 nodes)
    assert ours.score == pytest.approx(ref.score, rel=1e-5, abs=1e-6), (ours, ref)
    scores = sorted((d.score for d in candidates), reverse=True)
    if len(scores) > 1 and scores[0] - scores[1] < 1e-5 * scores[0]:
        # drafts of equal score (of two match lengths, or of both trees): which one wins is decided by rounding, ours
        # in float64 and the reference's in float32 (0.5 + 1/3 + 1/6 falls below 1.0 in one and not the other)
        return
    assert len(ours.tokens) == len(ref.token_ids), (ours, ref)
    assert ours.match_len == ref.match_len, (ours, ref)
    assert sorted(ours.probs) == pytest.approx(sorted(ref.probs), abs=1e-6), (ours, ref)
    if case["tree"] and case["budget"] == UNCAPPED and len(ours.tokens) < case["factor"] * ours.match_len:
        # nothing cut the draft (neither the budget nor ⌊α·m⌋): every node above the floor, a unique tree
        ref_paths, our_paths = paths(ref.token_ids, ref.parents), paths(ours.tokens, ours.parents)
        assert set(our_paths) == set(ref_paths)
        assert all(ours.probs[our_paths[p]] == pytest.approx(ref.probs[ref_paths[p]], abs=1e-6) for p in our_paths)
    if not case["tree"]:  # path mode: the same tokens, ties among equally frequent children included
        assert ours.tokens == ref.token_ids


def test_path_mode_follows_the_child_that_reached_the_shared_count_last():
    """After 1 the earlier output continued 2, 3, 2, 3: both twice; 3, first of the children counted once when it was
    counted up, went to the head of the children counted twice, so Arctic's path (and ours) goes 1 -> 3 (the
    smaller token id, our old rule, would go to 2)."""
    pair = pair_for("llama", 0.05)
    args = ([([], [1, 2, 1, 3, 1, 2, 1, 3])], [5, 1], [], 64, UNCAPPED, 64.0, 0.0, False)
    ref, (ours, _) = reference_draft(*args), our_draft(pair, *args)
    assert ref.token_ids[0] == 3 and ours.tokens == ref.token_ids and ours.probs == pytest.approx(ref.probs)


def test_a_node_exactly_at_the_floor_is_drafted_as_the_reference_drafts_it():
    """0.5 x 1/5 is 0.1, the floor, but rounds to just below it in float64 (hypothesis found it): both keep it."""
    pair = pair_for("llama", 0.05)
    args = ([([], [0, 0, 1, 0, 1, 0]), ([], [0, 0, 0, 1, 0, 1, 0, 1, 0])], [0, 0], [], 3, 8, 64.0, 0.1, True)
    ref, (ours, _) = reference_draft(*args), our_draft(pair, *args)
    assert sorted(ours.probs) == pytest.approx(sorted(ref.probs), abs=1e-6) and len(ref.probs) == 5
    assert min(ours.probs) == pytest.approx(0.1) and ours.score == pytest.approx(ref.score, rel=1e-6)


def test_a_hand_built_history_gives_the_references_draft():
    """An earlier output 10 11 12 13 14 10 11 12 15 and this request's 10 11 so far (its prompt 7 8 9): after "11"
    (3 occurrences, 2 followed by 12) p(12) = 2/3, then 13 and 15 at 1/3 each and the rest of the earlier output at
    1/3; "10 11" matches as well with the same draft (score 3), so the longer match (2) wins; the request's own tree
    has nothing after 11."""
    pair = pair_for("llama", 0.05)
    previous = [([1, 2, 3], [10, 11, 12, 13, 14, 10, 11, 12, 15])]
    want = {(12,): 2 / 3, (12, 13): 1 / 3, (12, 15): 1 / 3, (12, 13, 14): 1 / 3, (12, 13, 14, 10): 1 / 3,
            (12, 13, 14, 10, 11): 1 / 3, (12, 13, 14, 10, 11, 12): 1 / 3, (12, 13, 14, 10, 11, 12, 15): 1 / 3}
    args = (previous, [7, 8, 9], [10, 11], 64, UNCAPPED, 64.0, 0.1, True)
    ref, (ours, _) = reference_draft(*args), our_draft(pair, *args)
    assert (ours.match_len, ref.match_len) == (2, 2) and ours.score == pytest.approx(3.0) == ref.score
    for draft_paths, probs in ((paths(ours.tokens, ours.parents), ours.probs),
                               (paths(ref.token_ids, ref.parents), ref.probs)):
        assert {path: probs[i] for path, i in draft_paths.items()} == pytest.approx(want)


def test_a_tie_between_the_trees_keeps_the_requests_own_draft():
    """Exact halves, so no rounding decides: after "5" the request's tree (prompt 5 7 5) drafts 7 at 1/2 and the
    global one (an earlier output 5 6 5) drafts 6 at 1/2; one node each (α·m = 1). Both keep the request's."""
    pair = pair_for("llama", 0.05)
    args = ([([1, 2], [5, 6, 5])], [5, 7, 5], [], 64, 8, 1.0, 0.1, True)
    ref, (ours, candidates) = reference_draft(*args), our_draft(pair, *args)
    assert [d.score for d in candidates] == [0.5, 0.5]
    assert (ours.tokens, ours.score) == (ref.token_ids, ref.score) == ([7], 0.5)
