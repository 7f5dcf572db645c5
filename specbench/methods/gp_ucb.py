"""A small Gaussian-process UCB optimiser over the unit cube, what SWIFT's Bayesian steps suggest points with.

SWIFT (Xia et al. 2024; its code calls ``bayes_opt``'s ``BayesianOptimization(...).suggest(UtilityFunction("ucb",
kappa=2.5))`` with ``set_gp_params(alpha=1e-2)``) fits a Gaussian process to every (point, matchness) registered so
far and suggests the point maximising the upper confidence bound μ(x) + κ·σ(x). Written here with numpy (neither
scikit-learn nor bayes_opt is in the lock), the same model as bayes_opt's default:

- kernel Matérn ν = 5/2, one length scale l, no amplitude: k(r) = (1 + s + s²/3)·e^(−s), s = √5·r / l;
- targets normalised (mean 0, standard deviation 1), α = 1e-2 added to the kernel's diagonal (observation noise);
- l chosen by maximising the log marginal likelihood over log l in [log 1e-5, log 1e5] (a grid of 41 values, then
  golden-section search around the best; scikit-learn runs L-BFGS-B from 1 and 5 random restarts);
- no point registered yet: a uniform random point (bayes_opt's too);
- the acquisition maximised over 10,000 uniform random points, then by projected gradient ascent (analytic
  gradient, step halving) from the best 10 of them (bayes_opt: the same warm-up, then L-BFGS-B from 10 random
  points), clipped to the cube.

Deterministic given the ``numpy.random.Generator`` passed in.
"""
from __future__ import annotations

import math

import numpy as np

SQRT5 = math.sqrt(5.0)


def squared_distances(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """(n, d), (m, d) -> (n, m) |a_i - b_j|², without an (n, m, d) array."""
    return np.maximum((a * a).sum(1)[:, None] + (b * b).sum(1)[None, :] - 2.0 * a @ b.T, 0.0)


def matern52_of(squared: np.ndarray, length: float) -> np.ndarray:
    s = SQRT5 * np.sqrt(squared) / length
    return (1.0 + s + s * s / 3.0) * np.exp(-s)


def matern52(a: np.ndarray, b: np.ndarray, length: float) -> np.ndarray:
    """(n, d), (m, d) -> (n, m) Matérn-5/2 kernel values."""
    return matern52_of(squared_distances(a, b), length)


class GaussianProcess:
    """The posterior of a zero-mean GP (kernel above, noise ``alpha``) on normalised targets, given (X, y)."""

    def __init__(self, points: np.ndarray, targets: np.ndarray, alpha: float = 1e-2, length: float | None = None):
        self.points = np.asarray(points, dtype=np.float64)  # (n, d)
        y = np.asarray(targets, dtype=np.float64)  # (n,)
        self.mean_y = float(y.mean())
        self.std_y = float(y.std()) or 1.0  # scikit-learn's normalize_y: a constant y keeps scale 1
        self.y = (y - self.mean_y) / self.std_y
        self.alpha = alpha
        squared = squared_distances(self.points, self.points)
        self.length = fit_length_scale(squared, self.y, alpha) if length is None else float(length)
        chol = np.linalg.cholesky(matern52_of(squared, self.length) + alpha * np.eye(len(self.y)))
        chol_inv = np.linalg.inv(chol)
        self.inverse = chol_inv.T @ chol_inv  # (K + αI)⁻¹, (n, n): every prediction after is O(n²)
        self.weights = self.inverse @ self.y  # (K + αI)⁻¹ y

    def predict(self, x: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """(m, d) -> posterior mean and standard deviation (m,), (m,) in the targets' own scale."""
        k = matern52(np.atleast_2d(x), self.points, self.length)  # (m, n)
        mean = k @ self.weights
        var = np.maximum(1.0 - ((k @ self.inverse) * k).sum(1), 1e-12)
        return mean * self.std_y + self.mean_y, np.sqrt(var) * self.std_y

    def ucb_and_gradient(self, x: np.ndarray, kappa: float) -> tuple[float, np.ndarray]:
        """μ(x) + κσ(x) at one point (d,) and its gradient (d,)."""
        diff = x[None, :] - self.points  # (n, d)
        s = SQRT5 * np.sqrt((diff ** 2).sum(-1)) / self.length  # (n,)
        k = (1.0 + s + s * s / 3.0) * np.exp(-s)
        dk = -(5.0 / (3.0 * self.length ** 2)) * ((1.0 + s) * np.exp(-s))[:, None] * diff  # (n, d): ∂k_i/∂x
        inv_k = self.inverse @ k  # (K + αI)⁻¹ k
        var = max(1.0 - float(k @ inv_k), 1e-12)
        std = math.sqrt(var)
        mean_grad = self.weights @ dk
        std_grad = -(inv_k @ dk) / std  # ∂σ = ∂var / 2σ, ∂var = −2 (K + αI)⁻¹k · ∂k
        value = (float(k @ self.weights) + kappa * std) * self.std_y + self.mean_y
        return value, (mean_grad + kappa * std_grad) * self.std_y


def log_marginal_likelihood(squared: np.ndarray, y: np.ndarray, alpha: float, length: float) -> float:
    """log p(y | l) of the normalised targets, given the points' squared distances (n, n)."""
    try:
        chol = np.linalg.cholesky(matern52_of(squared, length) + alpha * np.eye(len(y)))
    except np.linalg.LinAlgError:
        return -math.inf
    half = np.linalg.solve(chol, y)  # L⁻¹ y: yᵀ (K + αI)⁻¹ y = |L⁻¹ y|²
    return float(-0.5 * half @ half - np.log(np.diag(chol)).sum() - 0.5 * len(y) * math.log(2 * math.pi))


def fit_length_scale(squared: np.ndarray, y: np.ndarray, alpha: float, low: float = 1e-5,
                     high: float = 1e5) -> float:
    """The length scale maximising the log marginal likelihood (module docstring), given squared distances."""
    def score(log_length: float) -> float:
        return log_marginal_likelihood(squared, y, alpha, math.exp(log_length))

    grid = np.linspace(math.log(low), math.log(high), 41)
    scores = [score(g) for g in grid]
    best = int(np.argmax(scores))
    a, b = grid[max(best - 1, 0)], grid[min(best + 1, len(grid) - 1)]
    ratio = (math.sqrt(5.0) - 1.0) / 2.0
    c, d = b - ratio * (b - a), a + ratio * (b - a)
    at_c, at_d = score(c), score(d)
    for _ in range(30):  # golden-section search on [a, b]: one new evaluation a step, the other point kept
        if at_c >= at_d:
            b, d, at_d = d, c, at_c
            c = b - ratio * (b - a)
            at_c = score(c)
        else:
            a, c, at_c = c, d, at_d
            d = a + ratio * (b - a)
            at_d = score(d)
    middle = (a + b) / 2.0
    return math.exp(middle) if score(middle) >= scores[best] else math.exp(grid[best])


def suggest(points, targets, dims: int, rng: np.random.Generator, kappa: float = 2.5, alpha: float = 1e-2,
            warmup: int = 10_000, starts: int = 10, steps: int = 60) -> np.ndarray:
    """The next point (dims,) in [0, 1]^dims to evaluate: argmax of the UCB (module docstring)."""
    if len(points) == 0:
        return rng.uniform(0.0, 1.0, dims)
    gp = GaussianProcess(np.asarray(points), np.asarray(targets), alpha)
    candidates = rng.uniform(0.0, 1.0, (warmup, dims))
    mean, std = gp.predict(candidates)
    ucb = mean + kappa * std
    order = np.argsort(-ucb)[:starts]
    best_x, best = candidates[order[0]], float(ucb[order[0]])
    for start in order:
        x = candidates[start].copy()
        value, grad = gp.ucb_and_gradient(x, kappa)
        step = 0.1
        for _ in range(steps):
            trial = np.clip(x + step * grad / (np.linalg.norm(grad) + 1e-12), 0.0, 1.0)
            trial_value, trial_grad = gp.ucb_and_gradient(trial, kappa)
            if trial_value > value:
                x, value, grad = trial, trial_value, trial_grad
            else:
                step /= 2.0
                if step < 1e-6:
                    break
        if value > best:
            best_x, best = x, value
    return np.clip(best_x, 0.0, 1.0)
