"""Recursive rejection sampling over token trees (decoding/verify.py ``verify_tree_sampling``) keeps the target's
distribution exactly at temperature > 0:

(1) one step on hand-built distributions (no model) — a sampled chain, point-mass siblings (n-gram candidates),
    sampled siblings, mixed trees, candidates the target gives probability 0, q equal to p, a root whose children
    are every token: the step's output, continued by the target to a fixed length, has exactly the target's
    distribution. Checked exactly, by enumerating every branch the real verifier can take, and by sampling with a
    real Sampler (chi-square); verifiers with one classic bug each fail both checks (power);
(2) whole generations of ``lookahead`` and ``ouroboros`` (their n-gram / draft candidates are point-mass trees) on
    the small-vocabulary pair are distributed as the target's own samples (exact by enumeration, chi-square), and
    the runs verified trees that branch, accepted later siblings after rejections and met candidates with p = 0;
(3) a seed fixes their output and every counter; different seeds give different outputs.

Why "continued to a fixed length": with sampled nodes the tree is random, so where a step stops is random too; what
exactness means is that the emitted tokens followed by the target's own continuation are distributed as the target's
own samples of the same length (the next step continues from the committed tokens alone). For point-mass trees it is
the same as comparing the emitted sequences themselves.

Statistical tests use fixed seeds, so they are deterministic; p < 1e-3 is the false-failure rate each would have under
a correct sampler with fresh seeds.
"""
from __future__ import annotations

import math
from collections import Counter, defaultdict

import pytest
import torch

from specbench.decoding import loop
from specbench.decoding.proposal import Proposal
from specbench.decoding.sampling import Sampler
from specbench.backends.token_tree import depths
from specbench.decoding.verify import verify_tree_sampling
from specbench.methods.lookahead import Lookahead
from specbench.methods.ouroboros import Ouroboros

from .distribution_helpers import one_thread  # noqa: F401  (autouse fixture: one torch thread)
from .distribution_helpers import (EOS, exact_sequence_distribution, goodness_of_fit, outputs_by_seed,
                                   sample_generations, small_vocab_pair)
from .test_equivalence import pair_for

ALPHA = 1e-3  # false-failure rate of each chi-square test
EXACT = 1e-5  # float32 rounding: the largest gap between two exact distributions that still counts as equal

# -- (1) one step, on hand-built distributions ------------------------------------------------------------------------

V = 5


def random_dist(seed: int, prefix, zeros=()) -> torch.Tensor:
    """A fixed (V,) float32 distribution for each (seed, prefix): a 'model' with no weights. ``zeros``: tokens it
    gives probability 0 (a top-p cut)."""
    code = sum((t + 1) * 7 ** i for i, t in enumerate(prefix))
    g = torch.Generator().manual_seed(1_000_003 * seed + code)
    p = torch.softmax(torch.randn(V, generator=g) * 1.2, dim=-1)
    if zeros:
        p[list(zeros)] = 0.0
    return p / p.sum()


def target(prefix):
    return random_dist(1, prefix)


def draft_a(prefix):
    return random_dist(2, prefix)


def draft_b(prefix):
    return random_dist(3, prefix)


def truncated_target(prefix):
    """Zero at tokens 2 and 4 after x0, at token 0 deeper (as top-p leaves tokens out)."""
    return random_dist(1, prefix, zeros=(2, 4) if not prefix else (0,))


def certain_target(prefix):
    """Sure of token 1 after x0: p = q = a point mass there."""
    return torch.eye(V)[1] if not prefix else random_dist(1, prefix)


# A tree: nodes (parent, what) in proposal order; what is a token (a point mass: an n-gram candidate, a draft's
# argmax) or a draft function (the node's token is sampled from it given the path, with the tokens of its earlier
# siblings taken out so that siblings stay distinct: sampling without replacement, q = the distribution it was drawn
# from, as the verifier must be told). Point-mass siblings come before sampled ones.
CASES = {
    "chain_sampled": (target, [(-1, draft_a), (0, draft_a)]),  # speculative decoding, γ = 2
    "point_siblings": (target, [(-1, 1), (-1, 3), (-1, 0), (0, 2), (0, 4), (1, 1), (2, 0)]),  # an n-gram trie
    "sampled_siblings": (target, [(-1, draft_a), (-1, draft_b), (-1, draft_a), (0, draft_b)]),
    "mixed": (target, [(-1, 2), (-1, draft_a), (0, 3), (0, draft_b), (1, 4), (1, draft_a)]),
    # a candidate with p = 0 (token 2 after x0, its subtree unreachable), a sampled sibling that may draw the other
    # p = 0 token, and p = 0 candidates one level down
    "zero_p": (truncated_target, [(-1, 2), (-1, draft_a), (0, 1), (1, 0), (1, draft_b)]),
    "q_is_p": (target, [(-1, target), (-1, draft_a), (0, target)]),  # always accepted: rejections only by rounding
    "certain": (certain_target, [(-1, 0), (-1, 1), (1, 3), (1, 0)]),  # p(0) = 0 rejected, then p = q = δ_1
    "every_token": (target, [(-1, t) for t in (4, 0, 2, 1, 3)] + [(2, 0), (2, 2)]),  # x0's own token never emitted
}


def path_tokens(tokens, parents, node) -> list[int]:
    """The tokens from x0 (exclusive) down to ``node`` (inclusive); [] for x0 itself."""
    out = []
    while node >= 0:
        out.append(tokens[node])
        node = parents[node]
    return out[::-1]


def one_step(case, sampler, verifier=verify_tree_sampling) -> tuple[int, ...]:
    """Draw the case's tree (sampled nodes with ``sampler``), verify it with ``verifier``; returns the emitted
    tokens (accepted path + the target's next token)."""
    model, nodes = CASES[case]
    tokens, parents, rows = [], [], []
    for parent, what in nodes:
        prefix = path_tokens(tokens, parents, parent)
        if isinstance(what, int):
            token, q = what, torch.eye(V)[what]
        else:
            q = what(prefix).clone()
            q[[t for t, p in zip(tokens, parents) if p == parent]] = 0.0
            q = q / q.sum()
            token = sampler.sample(q)
        tokens.append(token)
        parents.append(parent)
        rows.append(q)
    sampled = any(not isinstance(what, int) for _, what in nodes)
    proposal = Proposal(tokens, parents, torch.stack(rows) if sampled else None)  # point masses only: None
    target_probs = torch.stack([model([])] + [model(path_tokens(tokens, parents, n)) for n in range(len(tokens))])
    path, next_token = verifier(proposal, target_probs, sampler)
    return tuple(tokens[n] for n in path) + (next_token,)


def horizon(case) -> int:
    """Length every step's output is continued to: the most tokens one step can emit (depth + 1)."""
    return max(depths([p for p, _ in CASES[case][1]])) + 2


def target_distribution(case) -> dict[tuple, float]:
    """The target's own distribution over sequences of ``horizon(case)`` tokens after x0."""
    return continued({(): 1.0}, case)


def continued(dist: dict[tuple, float], case) -> dict[tuple, float]:
    """``dist`` over sequences, each continued by the target to ``horizon(case)`` tokens."""
    model, length, out = CASES[case][0], horizon(case), defaultdict(float)

    def walk(seq, prob):
        if len(seq) == length:
            out[seq] += prob
            return
        p = model(list(seq)).tolist()
        for t in range(V):
            if p[t] > 0:
                walk(seq + (t,), prob * p[t])

    for seq, prob in dist.items():
        walk(seq, prob)
    return dict(out)


class Branch(Exception):
    """A random draw past the end of the script: every outcome it can have, with its probability."""

    def __init__(self, options):
        self.options = options


class ScriptedSampler:
    """Stands in for Sampler to enumerate every path through one step exactly: each random draw takes the next
    choice of ``script``, and a draw past its end raises Branch. ``uniform()`` is symbolic: the acceptance test
    ``uniform() * q < p`` is the draw, true with probability min(1, p / q) = P(u q < p) for u ~ U[0, 1)."""

    def __init__(self, script):
        self.script, self.at = script, 0

    def choose(self, options):
        if self.at < len(self.script):
            self.at += 1
            return self.script[self.at - 1][0]
        raise Branch([(choice, weight) for choice, weight in options if weight > 0])

    def sample(self, probs: torch.Tensor) -> int:
        probs = probs.double() / probs.double().sum()  # torch.multinomial normalises too
        return self.choose(list(enumerate(probs.tolist())))

    def uniform(self):
        return SymbolicUniform(self, 1.0)


class SymbolicUniform:
    def __init__(self, sampler: ScriptedSampler, scale: float):
        self.sampler, self.scale = sampler, scale

    def __mul__(self, other):
        return SymbolicUniform(self.sampler, self.scale * float(other))

    __rmul__ = __mul__

    def __lt__(self, bound):
        bound = float(bound)
        accept = (1.0 if bound > 0 else 0.0) if self.scale <= 0 else min(1.0, max(bound, 0.0) / self.scale)
        return self.sampler.choose([(True, accept), (False, 1.0 - accept)])


def exact_step_distribution(case, verifier=verify_tree_sampling) -> dict[tuple, float]:
    """P(the step emits s) for every s, by running the step once per path through its random draws."""
    dist, scripts = defaultdict(float), [()]
    while scripts:
        script = scripts.pop()
        try:
            emitted = one_step(case, ScriptedSampler(script), verifier)
        except Branch as branch:
            scripts += [script + (option,) for option in branch.options]
            continue
        dist[emitted] += math.prod(weight for _, weight in script)
    return dict(dist)


def gap(a: dict, b: dict) -> float:
    return max(abs(a.get(k, 0.0) - b.get(k, 0.0)) for k in set(a) | set(b))


def flawed_verifier(flaw: str | None):
    """``verify_tree_sampling`` rewritten with one classic bug (None: none, the same algorithm):
    keep_rejected: after a rejection p stays as it was (a rejected point-mass token is not zeroed; a sampled one's
    correction comes from p instead of max(0, p - q)); no_renormalise: the residual is not divided by its mass (the
    later siblings' acceptance tests read it unnormalised); ignore_q: a sampled token is accepted with probability
    p(t), as if it were a point mass."""
    def verify(proposal, target_probs, sampler):
        kids, path, node = proposal.children(), [], -1
        while True:
            p = target_probs[node + 1]
            for child in kids.get(node, ()):
                token = proposal.tokens[child]
                q = torch.eye(p.shape[-1])[token] if proposal.probs is None else proposal.probs[child]
                q_token = 1.0 if flaw == "ignore_q" else float(q[token])
                if sampler.uniform() * q_token < float(p[token]):
                    path.append(child)
                    node = child
                    break
                if flaw == "keep_rejected":
                    continue
                residual = (p - q).clamp_min(0.0)
                if float(residual.sum()) <= 0.0:
                    residual = p
                p = residual if flaw == "no_renormalise" else residual / residual.sum()
            else:
                return path, sampler.sample(p)
    return verify


@pytest.mark.parametrize("case", sorted(CASES))
def test_one_step_keeps_the_target_distribution_exactly(case):
    """Every path through the step (each sampled node's token, each accept / reject, the final token) enumerated
    with its exact probability: the output continued by the target is the target's own distribution."""
    dist = exact_step_distribution(case)
    assert sum(dist.values()) == pytest.approx(1.0, abs=EXACT)
    want = target_distribution(case)
    assert gap(continued(dist, case), want) < EXACT
    assert gap(exact_step_distribution(case, flawed_verifier(None)), dist) < EXACT  # the flaws' baseline
    if case == "every_token":
        assert all(len(seq) >= 2 for seq in dist)  # a token for x0 is always one of its children
    if case == "zero_p":  # the p = 0 candidates are never accepted
        assert not any(seq[0] in (2, 4) for seq in dist) and not any(seq[1:2] == (0,) for seq in dist)
    if case == "point_siblings":  # point masses: the emitted sequences themselves have the target's probabilities
        model = CASES[case][0]
        for seq, prob in dist.items():
            assert prob == pytest.approx(math.prod(float(model(list(seq[:i]))[t]) for i, t in enumerate(seq)),
                                         abs=EXACT)


@pytest.mark.parametrize("case", sorted(CASES))
def test_the_verifier_is_the_flawless_rewrite_draw_for_draw(case):
    """verify_tree_sampling reads each node's first try in one go and forms residuals on the device; the rewrite
    above reads as it goes. Same seed, same trees: the same paths, tokens and generator state, step after step."""
    ours, theirs = Sampler(1.0, seed=11), Sampler(1.0, seed=11)
    for _ in range(300):
        assert one_step(case, ours) == one_step(case, theirs, flawed_verifier(None))
    assert torch.equal(ours.generator.get_state(), theirs.generator.get_state())


FLAWS = [("keep_rejected", "point_siblings"), ("keep_rejected", "chain_sampled"), ("no_renormalise", "every_token"),
         ("no_renormalise", "sampled_siblings"), ("ignore_q", "chain_sampled"), ("ignore_q", "mixed")]


@pytest.mark.parametrize("flaw, case", FLAWS)
def test_exact_check_detects_a_flawed_verifier(flaw, case):
    dist = exact_step_distribution(case, flawed_verifier(flaw))
    assert gap(continued(dist, case), target_distribution(case)) > 100 * EXACT


def sampled_counts(case, n: int, seed: int, verifier=verify_tree_sampling) -> Counter:
    """n steps with a real Sampler, each output continued by the target (same sampler) to the horizon."""
    sampler, model, length, counts = Sampler(1.0, seed=seed), CASES[case][0], horizon(case), Counter()
    for _ in range(n):
        seq = list(one_step(case, sampler, verifier))
        while len(seq) < length:
            seq.append(sampler.sample(model(seq)))
        counts[tuple(seq)] += 1
    return counts


@pytest.mark.parametrize("case", sorted(CASES))
def test_sampled_steps_pass_a_chi_square_test(case):
    """The same with the real Sampler's draws (torch's generator, the real comparison u * q < p): 6000 steps per
    tree against the target's exact distribution over 25-125 continued sequences."""
    counts = sampled_counts(case, 6000, seed=sorted(CASES).index(case))
    assert goodness_of_fit(counts, target_distribution(case)) > ALPHA


@pytest.mark.parametrize("flaw, case", FLAWS)
def test_chi_square_detects_a_flawed_verifier(flaw, case):
    counts = sampled_counts(case, 6000, seed=0, verifier=flawed_verifier(flaw))
    assert goodness_of_fit(counts, target_distribution(case)) < ALPHA


# -- (2) whole generations of lookahead and ouroboros ------------------------------------------------------------------

# every token is followed by several different ones: the prompt's n-grams give each last token a branching trie
WALK = [1, 2, 4, 0, 5, 1, 3, 2, 0, 4, 5, 2, 1, 0, 3, 4, 1, 4]
MAX_NEW = 3

METHODS = {
    "lookahead": lambda pair, **s: Lookahead(pair, window=2, ngram=3, guesses=5, **s),
    # γ = 1 leaves room for K = 3 suffixes after d_1 within the 3-token budget
    "ouroboros": lambda pair, **s: Ouroboros(pair, gamma=1, window=4, beta=3, top_k=3, pool_from_prompt=True, **s),
}


@pytest.fixture(scope="module")
def small_pair():
    return small_vocab_pair()


def record_trees(monkeypatch) -> Counter:
    """Wrap the loop's tree verifier to count what the steps were given and did."""
    stats, real = Counter(), loop.verify_tree_sampling

    def recording(proposal, target_probs, sampler):
        path, next_token = real(proposal, target_probs, sampler)
        kids = proposal.children()
        stats["steps"] += 1
        stats["branching"] += any(len(c) > 1 for c in kids.values())
        stats["later_sibling_accepted"] += any(kids[proposal.parents[n]][0] != n for n in path)
        stats["zero_p_candidates"] += sum(float(target_probs[p + 1, t]) == 0.0
                                          for t, p in zip(proposal.tokens, proposal.parents))
        stats["point_masses"] += proposal.probs is None
        return path, next_token

    monkeypatch.setattr(loop, "verify_tree_sampling", recording)
    return stats


@pytest.mark.parametrize("name, temperature, top_p", [("lookahead", 1.0, 1.0), ("ouroboros", 1.0, 1.0),
                                                      ("lookahead", 0.9, 0.95), ("ouroboros", 0.9, 0.95)])
def test_generations_are_distributed_as_the_targets(small_pair, monkeypatch, name, temperature, top_p):
    """3000 generations of at most 3 tokens (EOS included) after a prompt whose n-grams seed the pool, against the
    target's exact distribution over all 156 possible generations; the runs verified branching tries (a later
    sibling accepted after the earlier ones were rejected) and, with top-p, candidates outside the nucleus."""
    stats = record_trees(monkeypatch)
    method = METHODS[name](small_pair, temperature=temperature, top_p=top_p)
    counts, gens = sample_generations(method, WALK, MAX_NEW, {EOS}, 3000)
    assert stats["point_masses"] == stats["steps"] == sum(g.target_forwards for g in gens)
    assert sum(g.drafted for g in gens) > 3000 and sum(g.accepted for g in gens) > 300
    assert stats["branching"] > 1000 and stats["later_sibling_accepted"] > 100, stats
    if top_p < 1:
        assert stats["zero_p_candidates"] > 100, stats
    assert sum(c for seq, c in counts.items() if len(seq) < MAX_NEW) > 100  # early EOS
    target = exact_sequence_distribution(small_pair.target, temperature, top_p, WALK, MAX_NEW, {EOS})
    assert sum(target.values()) == pytest.approx(1.0, abs=1e-5)
    assert goodness_of_fit(counts, target) > ALPHA


def test_generation_test_detects_a_flawed_verifier(small_pair, monkeypatch):
    """Power of the test above: lookahead with rejected n-gram tokens left in the residual is rejected."""
    monkeypatch.setattr(loop, "verify_tree_sampling", flawed_verifier("keep_rejected"))
    counts, _ = sample_generations(METHODS["lookahead"](small_pair, temperature=1.0), WALK, MAX_NEW, {EOS}, 1500)
    target = exact_sequence_distribution(small_pair.target, 1.0, 1.0, WALK, MAX_NEW, {EOS})
    assert goodness_of_fit(counts, target) < ALPHA


# -- (3) seeds ------------------------------------------------------------------------------------------------------

SEED_METHODS = {
    "lookahead": lambda pair, **s: Lookahead(pair, window=3, ngram=3, guesses=4, **s),
    "ouroboros": lambda pair, **s: Ouroboros(pair, gamma=3, window=4, beta=3, top_k=2, pool_from_prompt=True, **s),
}
PROMPT = [10, 20, 30, 40, 50] * 3


def outcome(gen):
    return (gen.tokens, gen.accept_lengths, gen.proposed, gen.drafted, gen.accepted, gen.target_forwards,
            gen.draft_forwards, gen.forward_sizes, gen.extra)


@pytest.mark.parametrize("name", sorted(SEED_METHODS))
def test_same_seed_same_output_and_counters_whatever_came_before(name):
    pair = pair_for("llama", 0.05)
    method = SEED_METHODS[name](pair, temperature=1.0, top_p=0.95)
    method.reset(5)
    first = outcome(method.generate(PROMPT, 24, set()))
    assert 0 < first[4] < first[3], "candidates were verified, some accepted and some rejected"
    method.reset(9)
    method.generate([200, 201, 202, 200, 201], 17, set())  # another prompt and seed in between: no state may leak
    torch.manual_seed(1234)  # nor may the global RNG matter
    method.reset(5)
    assert outcome(method.generate(PROMPT, 24, set())) == first
    torch.manual_seed(4321)
    fresh = SEED_METHODS[name](pair, temperature=1.0, top_p=0.95, seed=5)  # no reset
    assert outcome(fresh.generate(PROMPT, 24, set())) == first


@pytest.mark.parametrize("name", sorted(SEED_METHODS))
def test_different_seeds_give_different_outputs(name):
    pair = pair_for("llama", 0.05)
    method = SEED_METHODS[name](pair, temperature=1.0)
    # 16 tokens at T=1 over 259 tokens: a repeat would mean the seed is ignored
    assert len(outputs_by_seed(method, PROMPT, 16)) == 6
