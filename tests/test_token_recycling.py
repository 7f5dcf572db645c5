"""Token Recycling: the adjacency matrix's update (every fed row, last occurrence wins) and its state copies, the
template filled from it on hand-built matrices (ranks, unseen rows, EOS, room, repeated siblings), the template
config, the loop's top-k rows against fresh forwards, output identical to greedy at T = 0, and at T > 0 whole
generations distributed exactly as the target's while the matrix learns across them (with a power check)."""
import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from specbench.decoding import loop
from specbench.decoding.loop import verify_step
from specbench.decoding.proposal import Proposal, Step, StepContext
from specbench.decoding.sampling import Sampler
from specbench.errors import ConfigError
from specbench.decoding.rank_tree import parse_tree
from specbench.methods.token_recycling import DEFAULT_TREE, AdjacencyMatrix, RecyclingTree, TokenRecycling, expand

from .distribution_helpers import one_thread  # noqa: F401  (autouse fixture: one torch thread)
from .distribution_helpers import EOS as SMALL_EOS
from .distribution_helpers import exact_sequence_distribution, goodness_of_fit, sample_generations, small_vocab_pair
from .test_counters import check_counters
from .test_equivalence import greedy_reference, pair_for
from .test_tree_sampling import flawed_verifier, record_trees

ALPHA = 1e-3  # false-failure rate of each chi-square test
EOS = 9


def matrix_with(rows: dict[int, list[int]], vocab: int = 12, k: int = 3, init: str = "empty") -> AdjacencyMatrix:
    matrix = AdjacencyMatrix(vocab, k, init)
    for token, row in rows.items():
        matrix.rows[token] = row
        matrix.fed[token] = True
    return matrix


def tree_of(proposal: Proposal) -> list[tuple[int, int]]:
    return list(zip(proposal.tokens, proposal.parents))


# -- the matrix -------------------------------------------------------------------------------------------------------

def test_every_fed_row_overwrites_its_tokens_candidates_and_the_last_occurrence_wins():
    matrix = matrix_with({1: [7, 7, 7], 4: [5, 6, 8]})
    matrix.update([1, 2, 1, 3], [[2, 3, 4], [5, 6, 7], [8, 9, 10], [1, 2, 3, 4]])  # a row may be wider than k
    assert matrix.candidates(1) == [8, 9, 10]  # fed twice: its later row
    assert matrix.candidates(2) == [5, 6, 7] and matrix.candidates(3) == [1, 2, 3]
    assert matrix.candidates(4) == [5, 6, 8]  # not fed: kept
    assert matrix.candidates(0) == [-1, -1, -1]  # never fed: empty
    assert matrix.filled() == 4
    matrix.update([], [])
    assert matrix.filled() == 4


def test_a_snapshot_is_a_copy_of_the_filled_rows_and_restores_them():
    matrix = AdjacencyMatrix(12, 3)
    assert matrix.snapshot() is None  # a new matrix carries nothing
    matrix.update([3, 8], [[1, 2, 4], [5, 6, 7]])
    state = matrix.snapshot()
    assert state.ids.tolist() == [3, 8] and state.rows.tolist() == [[1, 2, 4], [5, 6, 7]]
    matrix.update([3, 0], [[9, 9, 9], [1, 1, 1]])  # later writes do not reach the snapshot
    assert state == matrix_with({3: [1, 2, 4], 8: [5, 6, 7]}).snapshot()
    assert state != matrix.snapshot()
    matrix.restore(state)
    assert (matrix.rows == matrix_with({3: [1, 2, 4], 8: [5, 6, 7]}).rows).all()
    matrix.restore(None)
    assert matrix.filled() == 0


# -- the tree ---------------------------------------------------------------------------------------------------------

def test_a_matrix_from_zeros_is_the_papers_token_zero_until_fed_and_snapshots_only_fed_rows():
    matrix = AdjacencyMatrix(12, 3, "zeros")
    assert matrix.candidates(5) == [0, 0, 0] and matrix.filled() == 0 and matrix.snapshot() is None
    matrix.update([5], [[0, 7, 8]])  # a fed row may hold token 0 itself
    assert matrix.filled() == 1 and matrix.snapshot().ids.tolist() == [5]
    state = matrix.snapshot()
    matrix.clear()
    assert matrix.candidates(5) == [0, 0, 0] and matrix.filled() == 0
    matrix.restore(state)
    assert matrix.candidates(5) == [0, 7, 8] and matrix.filled() == 1


def test_the_template_is_filled_breadth_first_by_rank():
    matrix = matrix_with({1: [2, 3, 4], 2: [5, 6, 7], 3: [8, 0, 2], 5: [10, 11, 1]})
    template = [[0], [1], [2], [0, 0], [0, 1], [1, 0], [0, 0, 0], [0, 0, 2]]
    proposal = expand(matrix, template, 1, 10, {EOS})
    # x0=1 -> 2 3 4; 2 -> 5 6; 3 -> 8; 5 -> 10 and its 3rd candidate 1
    assert tree_of(proposal) == [(2, -1), (3, -1), (4, -1), (5, 0), (6, 0), (8, 1), (10, 3), (1, 3)]
    assert proposal.probs is None and proposal.depth == 3  # point masses


def test_a_token_never_fed_has_no_children():
    matrix = matrix_with({1: [2, 3, 4, 5]}, k=4)  # 2, 3, 4 and 5 never fed
    assert tree_of(expand(matrix, DEFAULT_TREE, 1, 10, set())) == [(2, -1), (3, -1), (4, -1), (5, -1)]
    assert expand(matrix, DEFAULT_TREE, 0, 10, set()).tokens == []  # x0 never fed: nothing to propose


def test_nothing_hangs_under_an_eos_and_depth_stops_at_the_room():
    matrix = matrix_with({1: [EOS, 2, 3], 2: [4, 5, 6], EOS: [7, 8, 10], 4: [5, 5, 5]})
    template = [[0], [1], [0, 0], [1, 0], [1, 0, 0]]
    assert tree_of(expand(matrix, template, 1, 10, {EOS})) == [(EOS, -1), (2, -1), (4, 1), (5, 2)]
    assert tree_of(expand(matrix, template, 1, 10, set())) == [(EOS, -1), (2, -1), (7, 0), (4, 1), (5, 3)]
    assert tree_of(expand(matrix, template, 1, 2, {EOS})) == [(EOS, -1), (2, -1), (4, 1)]
    assert expand(matrix, template, 1, 0, {EOS}).tokens == []


def test_a_static_tree_keeps_every_template_node_as_the_paper_does():
    """matrix_init=zeros with unique=False (the paper's): a token never fed proposes k copies of token 0, and every
    template node is fed every step (the verify cost of its 80-node tree), up to the room and EOS."""
    matrix = matrix_with({1: [2, 2, 3]}, init="zeros")  # 2 and 3 never fed: [0, 0, 0]
    template = [[0], [1], [2], [0, 0], [0, 1], [1, 0], [0, 0, 0]]
    proposal = expand(matrix, template, 1, 10, set(), unique=False)
    assert tree_of(proposal) == [(2, -1), (2, -1), (3, -1), (0, 0), (0, 0), (0, 1), (0, 3)]
    assert len(expand(matrix, template, 1, 2, set(), unique=False).tokens) == 6  # depth 3 is past the room
    assert tree_of(expand(matrix, template, 1, 10, set())) == [(2, -1), (3, -1), (0, 0), (0, 2)]  # a trie


def test_repeated_candidates_among_siblings_are_merged_and_a_missing_parent_drops_the_subtree():
    matrix = matrix_with({1: [2, 2, 3], 2: [4, 5, 6], 3: [7, 8, 10]})
    template = [[0], [1], [2], [0, 0], [1, 0], [1, 0, 0], [2, 0]]
    # [1] repeats [0]'s token 2: left out, and [1, 0], [1, 0, 0] with it; siblings stay distinct (a trie)
    assert tree_of(expand(matrix, template, 1, 10, set())) == [(2, -1), (3, -1), (4, 0), (7, 1)]


def test_widths_expand_to_the_full_tree_and_paths_sort_breadth_first():
    assert parse_tree([2, 1]) == [[0], [1], [0, 0], [1, 0]]
    assert parse_tree([[1, 0], [0], [1], [0, 0, 0], [0, 0]]) == [[0], [1], [0, 0], [1, 0], [0, 0, 0]]
    assert len(parse_tree(DEFAULT_TREE)) == 18 and max(map(len, DEFAULT_TREE)) == 6


def test_the_proposer_learns_from_every_fed_row_accepted_or_not():
    matrix = matrix_with({1: [2, 3, 4], 2: [5, 6, 7]})
    proposer = RecyclingTree(matrix, parse_tree([[0], [1], [0, 0]]))
    assert proposer.topk == 3  # the loop hands back the top-3 at every fed row
    proposal = proposer.propose(StepContext([8, 1], 0, 5, set(), Sampler()))
    assert tree_of(proposal) == [(2, -1), (3, -1), (5, 0)]
    topk = [[2, 10, 11], [6, 0, 1], [4, 4, 4], [3, 3, 3]]  # rows: x0=1, then nodes 2, 3, 5
    proposer.observe(Step(proposal, [0], 6, [2, 6, 4, 3], [], [8, 1, 2, 6], topk=topk))
    assert [matrix.candidates(t) for t in (1, 2, 3, 5)] == topk  # accepted (2) and rejected (3, 5) nodes alike
    assert proposer.extra() == {"steps": 1, "tree_nodes": [3], "tree_depth": [2], "rows_filled": 4}


# -- the loop's top-k rows --------------------------------------------------------------------------------------------

@pytest.mark.parametrize("arch", ["llama", "gpt2"])
def test_the_verify_step_returns_the_targets_topk_at_x0_and_every_node(arch):
    pair = pair_for(arch, 0.05)
    lm = pair.lm("target")
    prompt = [40, 41, 42, 43]
    proposal = Proposal([50, 60, 51, 52], [-1, -1, 0, 0])
    step = verify_step(lm, list(prompt), proposal, None, topk=4)
    assert len(step.topk) == 5 and all(len(row) == 4 for row in step.topk)
    paths = [[], [50], [60], [50, 51], [50, 52]]  # x0, then each node's path
    for path, row in zip(paths, step.topk):
        logits = pair.target(torch.tensor([prompt + path], device=pair.target.device)).logits[0, -1].float()
        assert row == logits.topk(4).indices.tolist()
    assert verify_step(pair.lm("target"), list(prompt), proposal, None).topk is None  # not asked: none


# -- T = 0: identical to greedy ---------------------------------------------------------------------------------------

TEMPLATES = [DEFAULT_TREE, [1], [3], [2, 2, 1], [1, 1, 1, 1, 1], [[0], [1], [0, 0], [0, 0, 0], [1, 0]]]

cases = st.fixed_dictionaries({
    "arch": st.sampled_from(["llama", "gpt2"]),
    "prompt": st.lists(st.integers(3, 258), min_size=1, max_size=10),
    "repeat": st.integers(1, 3),  # repeated text gives the matrix something to recycle
    "tree": st.sampled_from(range(len(TEMPLATES))),
    "warm_start": st.booleans(),
    "matrix_init": st.sampled_from(["empty", "zeros"]),
    "max_new_tokens": st.integers(1, 40),
    "eos_pick": st.one_of(st.none(), st.integers(0, 39)),
})


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(case=cases)
def test_token_recycling_equals_greedy(case):
    pair = pair_for(case["arch"], 0.05)
    prompt = case["prompt"] * case["repeat"]
    ref, eos = greedy_reference(pair, prompt, case["max_new_tokens"], case["eos_pick"])
    method = TokenRecycling(pair, tree=TEMPLATES[case["tree"]], warm_start=case["warm_start"],
                            matrix_init=case["matrix_init"])
    for run in range(2):  # the second generation starts from the matrix the first left (warm) or empty (cold)
        method.reset(run)
        gen = method.generate(prompt, case["max_new_tokens"], eos)
        assert gen.tokens == ref.tokens
        check_counters(gen, "token_recycling")
        assert len(gen.accept_lengths) == gen.target_forwards == gen.extra["steps"]  # one forward per step
        assert gen.draft_forwards == 0 and "draft" not in gen.forward_sizes
        assert gen.drafted == sum(gen.extra["tree_nodes"]) and max(gen.extra["tree_nodes"]) <= len(
            parse_tree(TEMPLATES[case["tree"]]))
    if not case["warm_start"]:
        method.reset(2)
        assert method.matrix.filled() == 0


def test_token_recycling_accepts_recycled_candidates_and_hot_start_helps():
    pair = pair_for("llama", 0.05)
    prompt = [5, 6, 7, 8, 9, 5, 6, 7] * 3
    ref, _ = greedy_reference(pair, prompt, 60, None)
    method = TokenRecycling(pair)
    cold = method.generate(prompt, 60, set())
    method.reset(1)
    hot = method.generate(prompt, 60, set())  # warm_start (default): M from the first generation
    assert cold.tokens == hot.tokens == ref.tokens
    assert 0 < cold.accepted < hot.accepted and hot.target_forwards < cold.target_forwards < 60
    assert cold.extra["tree_nodes"][0] == 0 and hot.extra["tree_nodes"][0] > 0  # cold: nothing known at first
    assert hot.extra["rows_filled"] > cold.extra["rows_filled"] > 0


def test_reset_empties_the_matrix_only_without_warm_start():
    pair = pair_for("llama", 0.05)
    for warm in (True, False):
        method = TokenRecycling(pair, tree=[2, 1], warm_start=warm)
        assert method.carries_state is warm and method.step_blocks() == {"target": 5}
        method.generate([5, 6, 7, 5, 6], 10, set())
        state = method.carried_state()
        assert state is not None
        method.reset(0)
        assert (method.carried_state() == state) is warm
        method.restore_state(state)
        assert method.carried_state() == state


# -- T > 0: exact, while the matrix learns -----------------------------------------------------------------------------

WALK = [1, 2, 4, 0, 5, 1, 3, 2, 0, 4, 5, 2, 1, 0, 3, 4, 1, 4]
MAX_NEW = 3


@pytest.fixture(scope="module")
def small_pair():
    return small_vocab_pair()


@pytest.mark.parametrize("temperature, top_p, tree", [(1.0, 1.0, [3, 2]), (0.9, 0.95, [5, 2])])
def test_generations_are_distributed_as_the_targets(small_pair, monkeypatch, temperature, top_p, tree):
    """3000 generations of at most 3 tokens over a 6-token vocabulary (EOS included) against the target's exact
    distribution over all 156 generations. The matrix is kept across generations (warm start) and rewritten after
    every step, so each tree is built from what earlier, randomly sampled steps left: the runs verified branching
    trees, accepted later siblings after rejections and, with top-p, candidates outside the nucleus."""
    stats = record_trees(monkeypatch)
    method = TokenRecycling(small_pair, tree=tree, temperature=temperature, top_p=top_p)  # 5 wide: past the nucleus
    counts, gens = sample_generations(method, WALK, MAX_NEW, {SMALL_EOS}, 3000)
    assert stats["point_masses"] == stats["steps"] == sum(g.target_forwards for g in gens)
    assert sum(g.drafted for g in gens) > 3000 and sum(g.accepted for g in gens) > 1000
    assert stats["branching"] > 1000 and stats["later_sibling_accepted"] > 100, stats
    if top_p < 1:
        assert stats["zero_p_candidates"] > 100, stats
    assert len({tuple(g.extra["tree_nodes"]) for g in gens}) > 3  # the trees changed as M did
    assert sum(c for seq, c in counts.items() if len(seq) < MAX_NEW) > 100  # early EOS
    target = exact_sequence_distribution(small_pair.target, temperature, top_p, WALK, MAX_NEW, {SMALL_EOS})
    assert sum(target.values()) == pytest.approx(1.0, abs=1e-5)
    assert goodness_of_fit(counts, target) > ALPHA


def test_generation_test_detects_a_flawed_verifier(small_pair, monkeypatch):
    """Power of the test above: rejected candidates left in the residual are detected."""
    monkeypatch.setattr(loop, "verify_tree_sampling", flawed_verifier("keep_rejected"))
    method = TokenRecycling(small_pair, tree=[3, 2], temperature=1.0)
    counts, _ = sample_generations(method, WALK, MAX_NEW, {SMALL_EOS}, 1500)
    target = exact_sequence_distribution(small_pair.target, 1.0, 1.0, WALK, MAX_NEW, {SMALL_EOS})
    assert goodness_of_fit(counts, target) < ALPHA


def test_a_seed_fixes_the_output_from_a_given_matrix():
    pair = pair_for("llama", 0.05)
    prompt = [10, 20, 30, 40, 50] * 3
    method = TokenRecycling(pair, tree=[2, 2, 1], temperature=0.3, top_p=0.95)
    method.generate(prompt, 40, set())  # fill M
    start = method.carried_state()
    method.reset(5)
    first = method.generate(prompt, 40, set())
    assert 0 < first.accepted < first.drafted
    for seed in (9, 5):
        method.reset(seed)
        method.restore_state(start)
        again = method.generate(prompt, 40, set())
        if seed == 5:
            assert (again.tokens, again.accept_lengths, again.extra) == (first.tokens, first.accept_lengths,
                                                                         first.extra)
        else:
            assert again.tokens != first.tokens


# -- settings ---------------------------------------------------------------------------------------------------------

@pytest.mark.parametrize("settings_, message", [
    ({"tree": []}, "method.tree: must be a non-empty list"),
    ({"tree": "wide"}, "method.tree: must be a non-empty list"),
    ({"tree": [2, 0]}, "method.tree: widths must be positive integers"),
    ({"tree": [[0], 1]}, "method.tree: must be a non-empty list"),
    ({"tree": [[0], [-1]]}, "method.tree: must be a non-empty list"),
    ({"tree": [[0], []]}, "method.tree: must be a non-empty list"),
    ({"tree": [[0], [0]]}, "method.tree: a rank path is listed twice"),
    ({"tree": [[0], [1, 0]]}, "method.tree: path [1, 0] has no parent path [1]"),
    ({"tree": [16, 16, 16]}, "method.tree: widths [16, 16, 16] make more than 1024 nodes"),
    ({"tree": [[0], [300]]}, "method.tree: rank 300 needs more candidates per token than the vocabulary"),
    ({"warm_start": "yes"}, "method.warm_start: must be true or false"),
    ({"matrix_init": "ones"}, "method.matrix_init: 'ones' is not one of ['empty', 'zeros']"),
])
def test_token_recycling_rejects_bad_settings(settings_, message):
    with pytest.raises(ConfigError) as caught:
        TokenRecycling(pair_for("llama", 0.05), **settings_)
    assert str(caught.value).startswith(message)
    assert "\n" not in str(caught.value)
