"""Lookahead decoding and its shared pieces: the n-gram pool, token-tree masks, tree verification."""
import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from specbench.backends.torch.cached_lm import CachedLM
from specbench.decoding.ngram_pool import NGramPool
from specbench.backends.token_tree import ancestors_mask, depths, path_to, tree_inputs
from specbench.decoding.verify import verify_tree_argmax
from specbench.errors import ConfigError
from specbench.decoding.proposal import Proposal
from specbench.methods.lookahead import Lookahead

from .test_equivalence import greedy_reference, pair_for


def test_pool_insertion_order_and_newest_first():
    pool = NGramPool(3)
    assert pool.insert([1, 2, 3]) and pool.insert([1, 4, 5]) and pool.insert([2, 2, 2])
    assert not pool.insert([1, 2, 3])  # already there: refreshed, not added
    assert pool.newest(1) == [(2, 3), (4, 5)] and pool.newest(1, 1) == [(2, 3)]
    assert pool.newest(9) == [] and len(pool) == 3 and [1, 4, 5] in pool
    with pytest.raises(ValueError):
        pool.insert([1, 2])


def test_pool_lru_cap_w_evicts_least_recently_inserted():
    pool = NGramPool(2, capacity=2)
    pool.insert([7, 1])
    pool.insert([7, 2])
    pool.insert([7, 1])  # 1 becomes the newest; 2 is now the least recent
    pool.insert([7, 3])
    assert pool.newest(7) == [(3,), (1,)]
    assert len(pool) == 2


def test_pool_refinement_replaces_a_used_suffix():
    pool = NGramPool(3, capacity=3)
    for suffix in ([1, 1], [2, 2], [3, 3]):
        pool.insert([5, *suffix])
    pool.replace(5, (2, 2), (8, 9))
    assert pool.newest(5) == [(8, 9), (3, 3), (1, 1)]
    pool.replace(6, (0, 0), (4, 4))  # an unknown old suffix: the new one is simply inserted
    assert pool.newest(6) == [(4, 4)]


def test_pool_from_prompt_inserts_every_ngram():
    pool = NGramPool(3)
    assert pool.insert_all([1, 2, 3, 1, 2, 3]) == 3  # (1,2,3) (2,3,1) (3,1,2); the repeat is not new
    assert pool.newest(1) == [(2, 3)] and pool.newest(3) == [(1, 2)]


def test_tree_mask_each_branch_sees_prefix_and_own_ancestors_only():
    # root x0; sentence draft d1 d2 as a chain; two suffixes hanging from d2 (Ouroboros Fig. 2)
    parents = [-1, 0, 1, 2, 3, 2, 5]
    #          x0 d1 d2 s1a s1b s2a s2b
    assert depths(parents) == [0, 1, 2, 3, 4, 3, 4]
    visible = ancestors_mask(parents)
    assert visible[4].tolist() == [True, True, True, True, True, False, False]  # suffix 1 sees prefix + itself
    assert visible[6].tolist() == [True, True, True, False, False, True, True]  # nothing of suffix 1
    assert visible[3].tolist() == [True, True, True, True, False, False, False]  # causal inside itself
    mask, positions = tree_inputs(parents, past=10, dtype=torch.float32, device="cpu")
    assert mask.shape == (1, 1, 7, 17) and positions.tolist() == [[10, 11, 12, 13, 14, 13, 14]]
    assert (mask[0, 0, :, :10] == 0).all()  # every node sees the whole cached prefix
    assert mask[0, 0, 6, 10 + 4] == torch.finfo(torch.float32).min and mask[0, 0, 6, 10 + 5] == 0
    assert path_to(parents, 6) == [0, 1, 2, 5, 6]
    with pytest.raises(ValueError):
        depths([0])


@pytest.mark.parametrize("arch", ["llama", "gpt2"])
def test_tree_forward_equals_sequential_forward_per_path(arch):
    pair = pair_for(arch, 0.05)
    prompt = list(range(10, 30))
    ids, parents = [5, 6, 7, 8, 9, 11], [-1, 0, 1, 0, 3, 1]
    lm = CachedLM(pair.target)
    lm.forward(prompt, keep_last=1)
    tree = lm.forward(ids, parents=parents)
    for leaf in (2, 4, 5):
        path = path_to(parents, leaf)
        ref = CachedLM(pair.target)
        ref.forward(prompt, keep_last=1)
        torch.testing.assert_close(ref.forward([ids[i] for i in path]), tree[path], rtol=0, atol=1e-4)


def test_trie_merges_shared_prefixes_and_tree_verification_follows_the_target():
    proposal = Proposal()  # hung after x0 = 50
    nodes = proposal.add_paths([(1, 2, 3), (1, 2, 4), (7, 8, 9)])
    assert nodes == [[0, 1, 2], [0, 1, 3], [4, 5, 6]] and proposal.tokens == [1, 2, 3, 4, 7, 8, 9]
    assert proposal.parents == [-1, 0, 1, 1, -1, 4, 5] and proposal.depth == 3 and not proposal.is_chain
    # the target's argmax at x0 then per node: after 50 -> 1, after 1 -> 2, after 2 -> 4, after 4 -> 6 (bonus)
    argmax = [1, 2, 4, 0, 6, 0, 0, 0]
    path, bonus = verify_tree_argmax(proposal, argmax)
    assert [proposal.tokens[n] for n in path] == [1, 2, 4] and bonus == 6
    path, bonus = verify_tree_argmax(proposal, [3] + argmax[1:])
    assert path == [] and bonus == 3


cases = st.fixed_dictionaries({
    "arch": st.sampled_from(["llama", "gpt2"]),
    "prompt": st.lists(st.integers(3, 258), min_size=1, max_size=12),
    "repeat": st.integers(1, 3),  # repeated prompts give the pool n-grams the model may follow
    "window": st.integers(1, 5),
    "ngram": st.integers(2, 5),
    "guesses": st.integers(1, 6),
    "pool_capacity": st.one_of(st.none(), st.integers(1, 4)),
    "pool_from_prompt": st.booleans(),
    "max_new_tokens": st.integers(1, 40),
    "eos_pick": st.one_of(st.none(), st.integers(0, 39)),
})


@settings(max_examples=50, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(case=cases)
def test_lookahead_equals_greedy(case):
    pair = pair_for(case["arch"], 0.05)
    prompt = case["prompt"] * case["repeat"]
    ref, eos = greedy_reference(pair, prompt, case["max_new_tokens"], case["eos_pick"])
    method = Lookahead(pair, window=case["window"], ngram=case["ngram"], guesses=case["guesses"],
                       pool_capacity=case["pool_capacity"], pool_from_prompt=case["pool_from_prompt"])
    gen = method.generate(prompt, case["max_new_tokens"], eos)
    assert gen.tokens == ref.tokens
    assert gen.accepted <= gen.drafted and gen.target_forwards == len(gen.accept_lengths)
    assert all(1 <= n <= case["ngram"] for n in gen.accept_lengths)
    assert gen.target_forwards == len(gen.accept_lengths)  # prefill shares the first step's forward


def test_lookahead_accepts_guesses_and_warm_start_keeps_the_pool():
    pair = pair_for("llama", 0.05)
    prompt = [5, 6, 7, 8] * 3
    ref = greedy_reference(pair, prompt, 60, None)[0]
    cold = Lookahead(pair, window=4, ngram=4, guesses=4)
    first = cold.generate(prompt, 60, set())
    assert first.tokens == ref.tokens
    assert first.accepted > 0 and max(first.accept_lengths) > 1, "guesses from the pool were accepted"
    warm = Lookahead(pair, window=4, ngram=4, guesses=4, warm_start=True)
    warm.reset(0)
    warm.generate(prompt, 60, set())
    pool_after_first = len(warm.pool)
    warm.reset(1)
    assert len(warm.pool) == pool_after_first  # warm start: kept across prompts
    again = warm.generate(prompt, 60, set())
    assert again.tokens == ref.tokens and again.accepted >= first.accepted
    cold.reset(1)
    assert len(cold.pool) == 0  # cold start: cleared per prompt


def test_lookahead_rejects_bad_settings():
    pair = pair_for("llama", 0.05)
    with pytest.raises(ConfigError, match="method.ngram"):
        Lookahead(pair, ngram=1)
    with pytest.raises(ConfigError, match="method.window"):
        Lookahead(pair, window=0)
