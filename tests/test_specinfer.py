"""SpecInfer's draft token tree: tree inputs against cached tree nodes, the tree's shape and budget, the caches
after a step, output identical to greedy, and bad settings."""
import dataclasses

import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from omegaconf import OmegaConf

from specbench.run.config_check import ConfigOnlyPair, construct
from specbench.backends.torch.cached_lm import CachedLM
from specbench.decoding.loop import verify_step
from specbench.decoding.proposal import StepContext
from specbench.decoding.sampling import Sampler
from specbench.backends.token_tree import path_to, tree_inputs
from specbench.errors import ConfigError
from specbench.methods.specinfer import DraftTree, SpecInfer

from .test_counters import check_counters
from .test_equivalence import greedy_reference, pair_for

# a tree of 9 nodes, parent before child; grown in three calls: nodes 0-2, 3-5, 6-8
TREE = [-1, -1, -1, 0, 0, 2, 3, 5, 6]
TOKENS = [11, 12, 13, 21, 22, 23, 31, 32, 33]
CALLS = [(0, 3), (3, 6), (6, 9)]


@pytest.mark.parametrize("split", [0, 2, 3, 5, 6, 9])
def test_tree_inputs_against_cached_nodes_are_the_rows_of_the_whole_tree(split):
    past = 7  # committed prefix
    whole_mask, whole_positions = tree_inputs(TREE, past, torch.float32, "cpu")
    mask, positions = tree_inputs(TREE[split:], past + split, torch.float32, "cpu", cached_parents=TREE[:split])
    assert torch.equal(mask[0, 0], whole_mask[0, 0, split:])
    assert torch.equal(positions[0], whole_positions[0, split:])


def test_tree_inputs_default_is_unchanged_and_bad_cached_trees_are_refused():
    mask, positions = tree_inputs([-1, 0, 0], 4, torch.float32, "cpu")
    explicit = tree_inputs([-1, 0, 0], 4, torch.float32, "cpu", cached_parents=())
    assert torch.equal(mask, explicit[0]) and positions.tolist() == [[4, 5, 5]]
    with pytest.raises(ValueError):
        tree_inputs([0], 1, torch.float32, "cpu", cached_parents=[-1, -1])  # 2 cached nodes, 1 position
    with pytest.raises(ValueError):
        tree_inputs([5], 4, torch.float32, "cpu", cached_parents=[-1])  # a parent that is not there yet


@pytest.mark.parametrize("arch", ["llama", "gpt2"])
def test_a_frontier_fed_against_cached_tree_nodes_equals_a_forward_over_each_path(arch):
    pair = pair_for(arch, 0.05)
    prompt = list(range(10, 30))
    lm = CachedLM(pair.target)
    lm.forward(prompt, keep_last=1)
    rows = []
    for start, stop in CALLS:  # one call per level, each hung from the nodes cached by the calls before
        rows.append(lm.forward(TOKENS[start:stop], parents=TREE[start:stop], cached_parents=TREE[:start]))
    assert lm.length == len(prompt) + len(TREE)
    tree = torch.cat(rows)
    for node in range(len(TREE)):
        ref = CachedLM(pair.target)
        ref.forward(prompt, keep_last=1)
        path = path_to(TREE, node)
        expected = ref.forward([TOKENS[i] for i in path])[-1]
        torch.testing.assert_close(tree[node], expected, rtol=0, atol=1e-4)
    with pytest.raises(ValueError):
        lm.forward([5], cached_parents=[-1])  # cached tree nodes only make sense for a tree


class MarkovDraft:
    """A stand-in draft whose next-token log-probabilities depend on the last token only (``table``)."""

    def __init__(self, table: dict[int, dict[int, float]], vocab: int = 10):
        self.table, self.vocab = table, vocab
        self.length = 0
        self.sizes: list[int] = []
        self.calls: list[tuple] = []

    def row(self, token):
        probs = torch.full((self.vocab,), 1e-6)
        for t, p in self.table.get(token, {}).items():
            probs[t] = p
        return probs.log()

    def forward(self, ids, keep_last=None, parents=None, cached_parents=()):
        self.calls.append((list(ids), None if parents is None else list(parents), list(cached_parents)))
        self.sizes.append(len(ids))
        self.length += len(ids)
        rows = torch.stack([self.row(t) for t in ids])
        return rows[-keep_last:] if keep_last else rows

    def crop(self, length):
        assert length <= self.length
        self.length = length


TABLE = {0: {1: 0.5, 2: 0.3, 3: 0.2}, 1: {4: 0.9, 5: 0.1}, 2: {6: 0.6, 7: 0.4}, 3: {8: 0.7, 9: 0.3},
         4: {5: 1.0}, 6: {7: 1.0}, 8: {9: 1.0}}


def grow(widths, max_nodes, room=100, eos=()):
    draft = MarkovDraft(TABLE)
    proposal = DraftTree(draft, widths, max_nodes).propose(StepContext([9, 0], 0, room, set(eos), Sampler()))
    return proposal, draft


def test_the_tree_has_the_draft_top_k_at_every_node():
    proposal, draft = grow([3, 2], 100)
    assert proposal.tokens == [1, 2, 3, 4, 5, 6, 7, 8, 9]
    assert proposal.parents == [-1, -1, -1, 0, 0, 1, 1, 2, 2] and proposal.probs is None
    # one draft forward per depth: the committed tokens, then depth 1's nodes hung from the prefix
    assert draft.calls == [([9, 0], None, []), ([1, 2, 3], [-1, -1, -1], [])]
    assert draft.length == 2  # cropped back to the committed sequence


def test_a_depth_over_the_budget_keeps_the_best_children_by_path_probability():
    proposal, draft = grow([3, 2, 1], 5)
    # depth 2's candidates by path probability: 1-4 .45, 2-6 .18, 3-8 .14, 2-7 .12, 1-5 .05 -> 2 fit
    assert proposal.tokens == [1, 2, 3, 4, 6] and proposal.parents == [-1, -1, -1, 0, 1]
    assert len(draft.calls) == 2  # the budget is spent: depth 3 is never expanded
    proposal, _ = grow([3, 2, 1], 7)  # 4 of the 6 fit: 1-5 (.05) and 3-9 (.06) are dropped
    assert proposal.tokens == [1, 2, 3, 4, 6, 7, 8] and proposal.parents == [-1, -1, -1, 0, 1, 1, 2]
    proposal, draft = grow([3, 1, 1], 7)  # depth 3: 1-4-5 (.45) beats 2-6-7 (.18) and 3-8-9 (.14)
    assert proposal.tokens == [1, 2, 3, 4, 6, 8, 5] and proposal.parents == [-1, -1, -1, 0, 1, 2, 3]
    # depth 3's forward: the cached tree nodes are depth 1's (hung from the prefix); depth 2's hang from them
    assert draft.calls[2] == ([4, 6, 8], [0, 1, 2], [-1, -1, -1])
    proposal, _ = grow([3], 1)
    assert proposal.tokens == [1]


def test_nothing_hangs_under_an_eos_and_the_room_caps_the_depth():
    proposal, draft = grow([3, 2], 100, eos={1})
    assert proposal.tokens == [1, 2, 3, 6, 7, 8, 9] and draft.calls[1][0] == [2, 3]
    proposal, draft = grow([3, 2, 1], 100, room=1)
    assert proposal.depth == 1 and len(draft.calls) == 1
    proposal, draft = grow([3, 2], 100, room=0)
    assert proposal.tokens == [] and draft.calls == []


def caches_equal_a_fresh_forward(lm: CachedLM, tokens):
    fresh = CachedLM(lm.model, vocab=lm.vocab)
    fresh.forward(tokens[:lm.length], keep_last=1)
    for ours, theirs in zip(lm.cache.layers, fresh.cache.layers):
        torch.testing.assert_close(ours.keys, theirs.keys, rtol=0, atol=1e-5)
        torch.testing.assert_close(ours.values, theirs.values, rtol=0, atol=1e-5)


@pytest.mark.parametrize("arch", ["llama", "gpt2"])
def test_after_a_step_both_caches_equal_a_fresh_forward_over_the_committed_tokens(arch):
    pair = pair_for(arch, 0.02)
    method = SpecInfer(pair, widths=[3, 2, 2], max_nodes=12)
    proposer = method.make_proposer([5, 6, 7])
    target = CachedLM(pair.target)
    tokens = [5, 6, 7, 8, 9]
    for _ in range(4):
        context = StepContext(tokens, 0, 50, set(), method.sampler)
        proposal = proposer.propose(context)
        assert not proposal.is_chain
        assert proposer.draft.length == len(tokens)  # the tree is gone: only committed tokens
        caches_equal_a_fresh_forward(proposer.draft, tokens)
        step = verify_step(target, tokens, proposal, None)
        proposer.observe(step)
        assert target.length == len(tokens) - 1  # every committed token but the newest
        caches_equal_a_fresh_forward(target, tokens)
        caches_equal_a_fresh_forward(proposer.draft, tokens)


cases = st.fixed_dictionaries({
    "arch": st.sampled_from(["llama", "gpt2"]),
    "noise": st.sampled_from([0.0, 0.02, 0.05, 0.2]),
    "prompt": st.lists(st.integers(3, 258), min_size=1, max_size=12),
    "widths": st.lists(st.integers(1, 4), min_size=1, max_size=5),
    "max_nodes": st.integers(1, 24),
    "max_new_tokens": st.integers(1, 40),
    "eos_pick": st.one_of(st.none(), st.integers(0, 39)),
})


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(case=cases)
def test_specinfer_equals_greedy(case):
    pair = pair_for(case["arch"], case["noise"])
    ref, eos = greedy_reference(pair, case["prompt"], case["max_new_tokens"], case["eos_pick"])
    gen = SpecInfer(pair, widths=case["widths"], max_nodes=case["max_nodes"]).generate(
        case["prompt"], case["max_new_tokens"], eos)
    assert gen.tokens == ref.tokens
    check_counters(gen, "specinfer")
    nodes, depths = gen.extra["tree_nodes"], gen.extra["tree_depth"]
    assert len(nodes) == len(depths) == gen.target_forwards == len(gen.accept_lengths)
    assert all(n <= case["max_nodes"] for n in nodes) and all(d <= len(case["widths"]) for d in depths)
    assert gen.drafted == sum(nodes) and gen.draft_forwards == sum(depths)  # one draft forward per depth
    assert all(n <= d + 1 for n, d in zip(gen.accept_lengths, depths))


def test_a_draft_equal_to_the_target_is_accepted_to_full_depth():
    pair = pair_for("llama", 0.0)
    gen = SpecInfer(pair, widths=[2, 2, 1], max_nodes=10).generate([5, 6, 7], 20, set())
    assert gen.accept_lengths == [4] * 5 and gen.extra["tree_nodes"] == [10] * 5


def test_specinfer_samples_above_temperature_zero():
    pair = pair_for("gpt2", 0.05)
    method = SpecInfer(pair, widths=[3, 2], max_nodes=8, temperature=0.9, seed=1)
    gen = method.generate([5, 6, 7], 25, set())
    check_counters(gen, "specinfer", sampled=True)
    method.reset(1)
    assert method.generate([5, 6, 7], 25, set()).tokens == gen.tokens  # seeded: reproducible


@pytest.mark.parametrize("settings_, message", [
    ({"max_nodes": 0}, "method.max_nodes: must be a positive integer"),
    ({"widths": []}, "method.widths: must be a non-empty list of positive integers"),
    ({"widths": [2, 0]}, "method.widths: must be a non-empty list of positive integers"),
    ({"widths": [2, True]}, "method.widths: must be a non-empty list of positive integers"),
    ({"widths": 3}, "method.widths: must be a non-empty list of positive integers"),
    ({"widths": [2, 260]}, "method.widths: a width of 260 is more children than the vocabulary has tokens (259)"),
])
def test_specinfer_rejects_bad_settings(settings_, message):
    with pytest.raises(ConfigError) as caught:
        SpecInfer(pair_for("llama", 0.05), **settings_)
    assert str(caught.value).startswith(message)


def test_the_vocabulary_check_waits_for_the_loaded_pair_where_only_the_weights_know_it():
    hub = {"_target_": "specbench.models.hub.load_hub_pair", "name": "vicuna-13b-68m", "draft": "double7/vicuna-68m"}
    node = OmegaConf.create({"_target_": "specbench.methods.specinfer.SpecInfer", "widths": [10 ** 6]})
    construct(node, "method", pair=ConfigOnlyPair(hub), temperature=0.0, top_p=1.0, seed=0)  # left for later
    tiny = {"_target_": "specbench.models.tiny.build_tiny_pair", "name": "tiny-llama"}
    with pytest.raises(ConfigError, match="^method.widths: a width of 1000000 is more children"):
        construct(node, "method", pair=ConfigOnlyPair(tiny), temperature=0.0, top_p=1.0, seed=0)


def test_specinfer_needs_a_draft_model():
    pair = dataclasses.replace(pair_for("llama", 0.05), draft=None)
    with pytest.raises(ConfigError, match="^model: method 'specinfer' needs a draft model; pair 'tiny-llama' has none"):
        SpecInfer(pair, "specinfer")
