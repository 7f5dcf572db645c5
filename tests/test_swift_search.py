"""SWIFT's optimisation of the skip set (methods/swift_search.py) and the Gaussian-process UCB it suggests points with
(methods/gp_ucb.py): SWIFT's space, start and sizes; its keep / stop rules on scripted matchness; Bayesian steps on
schedule; the GP's algebra against closed forms and finite differences; UCB finding a maximum; and, on a tiny target
whose sublayers write nothing, the optimisation finding them while decoding."""
import math

import numpy as np
import pytest
import torch

from specbench.methods.gp_ucb import (GaussianProcess, fit_length_scale, log_marginal_likelihood, matern52,
                                      squared_distances, suggest)
from specbench.methods.swift import Swift
from specbench.methods.swift_search import (SkipSet, SkipSetOptimiser, as_skip_set, initial_skip_set, skip_size,
                                            skip_units)
from specbench.models.tiny import build_tiny_pair

IDS = [5, 9, 40, 7, 7, 120, 33, 8, 19, 200, 5, 9]


def optimiser(layers=6, space="sublayers", ratio=0.5, bayes=0, max_iterations=1000, max_tolerance=300,
              max_score=0.95, seed=0):
    return SkipSetOptimiser(layers, space, ratio, bayes, max_iterations, max_tolerance, max_score, seed)


def test_the_space_keeps_the_first_and_last_layers_and_sizes_and_starts_as_swift_does():
    assert skip_units(6, "layers") == [("layer", i) for i in (1, 2, 3, 4)]
    assert skip_units(4, "sublayers") == [("attention", 1), ("attention", 2), ("mlp", 1), ("mlp", 2)]
    assert skip_units(2, "sublayers") == [("attention", 0), ("attention", 1), ("mlp", 0), ("mlp", 1)]  # no interior
    assert skip_size(52, 0.45, "sublayers") == 23       # SWIFT on a 28-layer model: int(2 * 26 * 0.45)
    assert skip_size(4, 0.45, "layers") == 2 and skip_size(4, 0.1, "layers") == 1 and skip_size(4, 0.99, "layers") == 3
    assert SkipSet.normalised([2], [1, 3], [3, 4]) == SkipSet((2, 3), (1,), (4,))  # both halves: a whole layer
    assert initial_skip_set(28) == SkipSet(tuple(range(1, 27, 2)))  # np.arange(1, L - 1, 2), attention and MLP
    assert initial_skip_set(2) == SkipSet() and initial_skip_set(3) == SkipSet((1,))


def test_random_candidates_are_of_the_size_inside_the_space_and_seeded():
    drawn = [optimiser(seed=3).candidate() for _ in range(2)]
    assert drawn[0] == drawn[1]
    opt = optimiser(seed=3)
    sets = [opt.candidate() for _ in range(20)]
    assert len({s for _, s, _ in sets}) > 10
    for point, skip, kind in sets:
        assert kind == "random" and sorted(set(point)) == [0.0, 1.0] and sum(point) == 4  # int(8 * 0.5)
        assert len(skip.attention) + len(skip.mlp) + 2 * len(skip.layers) == 4
        assert all(0 < i < 5 for i in skip.layers + skip.attention + skip.mlp)  # the ends are never skipped


def test_a_candidate_is_kept_only_when_it_beats_the_best_and_the_rules_stop_it():
    """Hand-worked against swift_optimization: score > best keeps it and zeroes the tolerance count; otherwise the
    count grows; stop when it passes max_tolerance, when iterations pass max_iterations, or when a kept score
    passes max_score."""
    opt = optimiser(max_tolerance=2, max_score=0.9)
    scores = iter([0.5, 0.5, 0.4, 0.6, 0.1, 0.1, 0.1])
    seen = []
    while opt.active:
        before = opt.skip
        step = opt.iterate(lambda skip: next(scores))
        seen.append((step["matchness"], step["kept"], opt.tolerance))
        assert (opt.skip != before) == step["kept"] or opt.skip == before
    assert seen == [(0.5, True, 0), (0.5, False, 1), (0.4, False, 2), (0.6, True, 0), (0.1, False, 1),
                    (0.1, False, 2), (0.1, False, 3)]
    assert opt.stopped == "max_tolerance" and opt.best == 0.6 and opt.iterations == 7
    opt = optimiser(max_score=0.9)
    opt.iterate(lambda skip: 0.95)
    assert opt.stopped == "max_score" and opt.best == 0.95
    opt = optimiser(max_iterations=3)
    for _ in range(4):
        opt.iterate(lambda skip: 0.2)  # only the first gains
    assert opt.stopped == "max_iterations" and opt.iterations == 4


def test_every_bayes_interval_th_candidate_is_the_gp_suggestion():
    opt = optimiser(bayes=3)
    kinds = [opt.iterate(lambda skip: sum(skip.attention) / 10)["kind"] for _ in range(7)]
    assert kinds == ["random", "random", "bayes", "random", "random", "bayes", "random"]
    assert any(0 < v < 1 for v in opt.points[2])  # the suggestion itself is registered, as bayes_opt does
    opt.iterate(lambda skip: 0.0)
    point, skip, kind = opt.candidate()  # the 9th: a suggestion; its set, the units with the largest coordinates
    top = np.argsort(-np.array(point), kind="stable")[:opt.size]
    assert kind == "bayes" and skip == as_skip_set([opt.units[u] for u in top])


def test_the_state_round_trips_and_continues_the_same_draws():
    opt = optimiser(bayes=2)
    assert opt.snapshot() is None
    for _ in range(3):
        opt.iterate(lambda skip: len(skip.mlp) / 4)
    state = opt.snapshot()
    ahead = [opt.iterate(lambda skip: len(skip.mlp) / 4) for _ in range(3)]
    again = optimiser(bayes=2)
    again.restore(state)
    assert [again.iterate(lambda skip: len(skip.mlp) / 4) for _ in range(3)] == ahead and again.skip == opt.skip


# -- the Gaussian process -----------------------------------------------------------------------------------------

def test_one_point_posterior_is_the_closed_form():
    """One observation, normalised to 0 (a single y has std 0: scale 1): mean y everywhere it is unknown, variance
    1 - k²/(1 + α) at distance r."""
    gp = GaussianProcess(np.array([[0.2, 0.4]]), np.array([0.7]), alpha=1e-2, length=0.5)
    mean, std = gp.predict(np.array([[0.2, 0.4], [0.5, 0.8]]))
    r = math.dist([0.2, 0.4], [0.5, 0.8])
    s = math.sqrt(5) * r / 0.5
    k = (1 + s + s * s / 3) * math.exp(-s)
    np.testing.assert_allclose(mean, [0.7, 0.7])
    np.testing.assert_allclose(std ** 2, [1 - 1 / 1.01, 1 - k * k / 1.01], rtol=1e-9)


def test_the_posterior_interpolates_and_the_ucb_gradient_is_the_finite_difference():
    rng = np.random.default_rng(0)
    x = rng.uniform(size=(12, 3))
    y = np.sin(3 * x[:, 0]) + x[:, 1] ** 2
    gp = GaussianProcess(x, y, alpha=1e-6)
    mean, std = gp.predict(x)
    np.testing.assert_allclose(mean, y, atol=1e-3)
    assert (std < 1e-2 * y.std()).all()
    at = rng.uniform(size=3)
    value, grad = gp.ucb_and_gradient(at, 2.5)
    m, s = gp.predict(at[None])
    assert value == pytest.approx(float(m[0] + 2.5 * s[0]))
    eps = 1e-6
    numeric = [(gp.ucb_and_gradient(at + eps * e, 2.5)[0] - gp.ucb_and_gradient(at - eps * e, 2.5)[0]) / (2 * eps)
               for e in np.eye(3)]
    np.testing.assert_allclose(grad, numeric, rtol=1e-4, atol=1e-6)


def test_the_length_scale_maximises_the_marginal_likelihood():
    rng = np.random.default_rng(1)
    x = rng.uniform(size=(15, 2))
    y = np.cos(4 * x[:, 0]) * np.sin(2 * x[:, 1])
    y = (y - y.mean()) / y.std()
    squared = squared_distances(x, x)
    np.testing.assert_allclose(squared, ((x[:, None] - x[None]) ** 2).sum(-1), atol=1e-12)
    fitted = fit_length_scale(squared, y, 1e-2)
    best = log_marginal_likelihood(squared, y, 1e-2, fitted)
    assert all(best >= log_marginal_likelihood(squared, y, 1e-2, fitted * f) - 1e-9
               for f in (0.5, 0.8, 0.95, 1.05, 1.25, 2))
    assert matern52(x[:1], x[:1], fitted)[0, 0] == 1.0


def test_gp_ucb_finds_the_maximum_of_a_smooth_function():
    rng = np.random.default_rng(2)
    f = lambda p: -float(((p - np.array([0.7, 0.2])) ** 2).sum())  # noqa: E731
    points, targets = [], []
    assert ((p := suggest(points, targets, 2, rng)) >= 0).all() and (p <= 1).all()  # nothing known: uniform
    for _ in range(25):
        point = suggest(points, targets, 2, rng, warmup=2000)
        assert ((point >= 0) & (point <= 1)).all()
        points.append(list(point))
        targets.append(f(point))
    assert max(targets) > -0.01  # within 0.1 of the maximum


# -- while decoding --------------------------------------------------------------------------------------------------

def test_the_optimisation_finds_the_sublayers_that_do_nothing_while_decoding():
    """A 4-layer target whose layer 1 attention and layer 2 MLP write nothing: SWIFT's space is 4 sublayers, a
    candidate skips 2; the one skipping exactly those drafts the target's own tokens, matchness 1 > max_score,
    and the optimisation stops there with it; the next prompt drafts with it and accepts every chain token."""
    pair = build_tiny_pair(name="tiny-llama-4", layers=4, seed=3, load_draft=False)
    with torch.no_grad():
        pair.target.model.layers[1].self_attn.o_proj.weight.zero_()
        pair.target.model.layers[2].mlp.down_proj.weight.zero_()
    method = Swift(pair, gamma=3, stop_confidence=None, tree=False, skip_ratio=0.5, context_window=4,
                   bayes_interval=0, seed=1)
    first = method.generate(IDS, 40, set())
    state = first.extra["optimisation_state"]
    assert state["stopped"] == "max_score" and state["best"] == 1.0
    assert method.skip_set() == SkipSet((), (1,), (2,))
    assert first.extra["optimisation"]["matchness"][-1] == 1.0 and first.extra["optimisation"]["kept"][-1]
    second = method.generate(IDS[:5], 20, set())
    assert second.extra["skip_source"] == "optimised" and "optimisation" not in second.extra
    assert (second.extra["skip_attention"], second.extra["skip_mlp"]) == ([1], [2])
    assert second.accept_lengths[1:-1] == [4] * (len(second.accept_lengths) - 2)
