"""What method=swift skips, and SWIFT's optimisation of it, interleaved with decoding (Xia et al. 2024, §3.2).

A skip set (``SkipSet``) names whole decoder layers and single sublayers (a layer's attention or its MLP); it is kept
normalised: a layer with both halves skipped is a whole layer. The optimisation draws candidate sets from a space of
*units*: SWIFT's is every attention and MLP sublayer of the interior layers (the first and last layers are always
kept), ``search_space: sublayers``; ``layers`` draws whole interior layers instead (a coarser space).
A target of two layers has no interior: its ends cannot be kept, and the units are all of its (sub)layers.

The optimisation as SWIFT's code runs it (hemingkx/SWIFT, ``swift_optimization`` and its ``statistics``), state
carried from prompt to prompt:
- start: SWIFT's unified initialisation, the attention and MLP of every other interior layer (1, 3, 5, ...);
- once more than ``context_window`` + 1 tokens of a prompt are generated, every ``opt_interval``-th step after
  its verification: one candidate of int(2 (L − 2) r) units (r the skip ratio; whole layers: round((L − 2) r)) —
  uniformly random, or every ``bayes_interval``-th iteration the units with the largest coordinates of a Gaussian-
  process UCB suggestion over [0, 1]^units (gp_ucb.py) fitted to every candidate scored so far (random ones as 0/1
  points);
- its matchness: one forward of the candidate's layer-skipped target over the prompt's first ``context_window`` + 1
  generated tokens, after the target's cache of the prompt (as a prefix, untouched), the share of the
  ``context_window`` positions whose argmax is the next generated token;
- kept when it beats the best matchness so far, else the set in use stays; the optimisation stops for good when
  the best passes ``max_score``, after more than ``max_tolerance`` iterations in a row without gain, or after more
  than ``max_iterations`` in all (SWIFT's ``>``: 301 and 1001 with its settings).
A candidate that skips every attention sublayer (possible only without an interior) scores 0 without a forward.
"""
from __future__ import annotations

import copy
from typing import Callable, NamedTuple, Sequence

import numpy as np
import torch

from ..errors import ConfigError
from ..models.layer_skip import LayerSkipModel, attention_runs
from .gp_ucb import suggest

SPACES = ("sublayers", "layers")


class SkipSet(NamedTuple):
    """Full-model layer indices the draft skips: whole layers, attention sublayers alone, MLP sublayers alone."""
    layers: tuple[int, ...] = ()
    attention: tuple[int, ...] = ()
    mlp: tuple[int, ...] = ()

    @classmethod
    def normalised(cls, layers=(), attention=(), mlp=()) -> "SkipSet":
        whole = set(layers) | (set(attention) & set(mlp))
        return cls(tuple(sorted(whole)), tuple(sorted(set(attention) - whole)), tuple(sorted(set(mlp) - whole)))

    def model(self, target: torch.nn.Module) -> LayerSkipModel:
        return LayerSkipModel(target, self.layers, self.attention, self.mlp)

    def runs_attention(self, layers: int) -> bool:
        return attention_runs(self.layers, self.attention, layers)

    def extra(self) -> dict:
        """The record's keys: ``skip_layers`` always, ``skip_attention`` / ``skip_mlp`` when not empty."""
        return {"skip_layers": list(self.layers),
                **({"skip_attention": list(self.attention)} if self.attention else {}),
                **({"skip_mlp": list(self.mlp)} if self.mlp else {})}

    def state(self) -> dict:
        return {"layers": list(self.layers), "attention": list(self.attention), "mlp": list(self.mlp)}

    @classmethod
    def from_state(cls, state) -> "SkipSet":
        return cls.normalised(state.get("layers", ()), state.get("attention", ()), state.get("mlp", ()))


def skip_units(layers: int, space: str) -> list[tuple[str, int]]:
    """The optimisation's coordinates: ("layer", i), or ("attention", i) then ("mlp", i) (SWIFT's order), for the
    interior layers (all of them when there are two or fewer)."""
    if space not in SPACES:
        raise ConfigError(f"method.search_space: must be one of {list(SPACES)}, got {space!r}")
    drawn = range(1, layers - 1) if layers > 2 else range(layers)
    if space == "layers":
        return [("layer", i) for i in drawn]
    return [("attention", i) for i in drawn] + [("mlp", i) for i in drawn]


def skip_size(units: int, ratio: float, space: str) -> int:
    """How many units a candidate skips (module docstring), at least one and never all."""
    size = int(units * ratio) if space == "sublayers" else round(units * ratio)
    return min(max(1, size), units - 1)


def as_skip_set(chosen: Sequence[tuple[str, int]]) -> SkipSet:
    pick = {kind: [i for k, i in chosen if k == kind] for kind in ("layer", "attention", "mlp")}
    return SkipSet.normalised(pick["layer"], pick["attention"], pick["mlp"])


def initial_skip_set(layers: int) -> SkipSet:
    """SWIFT's unified initialisation: every other interior layer, attention and MLP (np.arange(1, L - 1, 2))."""
    return SkipSet.normalised(range(1, layers - 1, 2))


class SkipSetOptimiser:
    """SWIFT's optimisation of the skip set (module docstring), one iteration per ``iterate`` call."""

    def __init__(self, layers: int, space: str, ratio: float, bayes_interval: int, max_iterations: int,
                 max_tolerance: int, max_score: float, seed: int, kappa: float = 2.5, alpha: float = 1e-2):
        self.layers, self.units = layers, skip_units(layers, space)
        if len(self.units) < 2:
            raise ConfigError(f"method.search_space: {space} on a target of {layers} decoder layers leaves "
                              f"{len(self.units)} unit to choose from: nothing to optimise; use sublayers, or a "
                              "fixed method.skip_layers")
        self.size = skip_size(len(self.units), ratio, space)
        self.bayes_interval, self.max_iterations = bayes_interval, max_iterations
        self.max_tolerance, self.max_score, self.kappa, self.alpha = max_tolerance, max_score, kappa, alpha
        self.seed = seed
        self.restore(None)

    def restore(self, state: dict | None) -> None:
        """Start from ``state`` (a ``snapshot``), or from SWIFT's start (None)."""
        if state is None:
            rng = np.random.default_rng(self.seed)
            state = {"skip": initial_skip_set(self.layers).state(), "best": 0.0, "iterations": 0, "tolerance": 0,
                     "stopped": None, "points": [], "targets": [], "rng": rng.bit_generator.state}
        state = copy.deepcopy(state)
        self.skip = SkipSet.from_state(state["skip"])
        self.best, self.iterations, self.tolerance = state["best"], state["iterations"], state["tolerance"]
        self.stopped = state["stopped"]  # why the optimisation ended (None: still running)
        self.points, self.targets = state["points"], state["targets"]
        self.rng = np.random.default_rng()
        self.rng.bit_generator.state = state["rng"]

    def snapshot(self) -> dict | None:
        """What carries to the next prompt; None while nothing was tried (the start, as ``restore(None)`` makes it)."""
        if self.iterations == 0:
            return None
        return copy.deepcopy({"skip": self.skip.state(), "best": self.best, "iterations": self.iterations,
                              "tolerance": self.tolerance, "stopped": self.stopped, "points": self.points,
                              "targets": self.targets, "rng": self.rng.bit_generator.state})

    @property
    def active(self) -> bool:
        return self.stopped is None

    def candidate(self) -> tuple[list[float], SkipSet, str]:
        """The next candidate: its point in [0, 1]^units, its skip set, and how it was drawn (random, bayes)."""
        if self.bayes_interval and (self.iterations + 1) % self.bayes_interval == 0:
            point = suggest(self.points, self.targets, len(self.units), self.rng, self.kappa, self.alpha)
            chosen = np.argsort(-point, kind="stable")[:self.size]
            kind = "bayes"
        else:
            chosen = self.rng.choice(len(self.units), self.size, replace=False)
            point = np.zeros(len(self.units))
            point[chosen] = 1.0
            kind = "random"
        return [float(v) for v in point], as_skip_set([self.units[u] for u in sorted(chosen)]), kind

    def iterate(self, matchness: Callable[[SkipSet], float]) -> dict:
        """One iteration: draw a candidate, score it with ``matchness``, keep it if it beats the best, update the
        stopping counters; returns what happened (for the record)."""
        point, skip, kind = self.candidate()
        score = matchness(skip) if skip.runs_attention(self.layers) else 0.0
        self.points.append(point)
        self.targets.append(score)
        kept = score > self.best
        if kept:
            self.skip, self.best, self.tolerance = skip, score, 0
            if score > self.max_score:
                self.stopped = "max_score"
        else:
            self.tolerance += 1
        self.iterations += 1
        if self.stopped is None and self.tolerance > self.max_tolerance:
            self.stopped = "max_tolerance"
        if self.stopped is None and self.iterations > self.max_iterations:
            self.stopped = "max_iterations"
        return {"kind": kind, "matchness": score, "kept": kept}
